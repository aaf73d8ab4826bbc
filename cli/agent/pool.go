package agent

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	corev1 "k8s.io/api/core/v1"

	"github.com/nodectl/nodectl/agent/recorded"
	"github.com/nodectl/nodectl/analyzer"
	agentv1 "github.com/nodectl/nodectl/api/agent/v1"
	"github.com/nodectl/nodectl/cli/internal/remote"
)

// poolParallel is how many nodes' agents --all-nodes asks at once: each is a port-forward
// through the API server.
const poolParallel = 8

// nodeAnswer is one node's agent's answer, or why there is none.
type nodeAnswer[T any] struct {
	node, pod string
	value     T
	err       error
}

// askPool asks every node's agent, poolParallel at a time, and returns the answers by node.
func askPool[T any](cmd *cobra.Command, ask func(context.Context, agentv1.AgentClient) (T, error)) ([]nodeAnswer[T], error) {
	rf := remote.FromCommand(cmd)
	if rf.Node != "" {
		return nil, fmt.Errorf("--all-nodes and --%s: choose one", remote.FlagNode)
	}
	c, err := remote.Connect(rf)
	if err != nil {
		return nil, err
	}
	ctx := cmd.Context()
	pods, err := c.AgentPods(ctx, "")
	if err != nil {
		return nil, err
	}
	if len(pods) == 0 {
		return nil, fmt.Errorf("--all-nodes: no nodectl agent pod (%s) in namespace %s: is the DaemonSet deployed (kubectl apply -k deploy/base)?", remote.AgentSelector, c.Namespace)
	}
	out := make([]nodeAnswer[T], len(pods))
	sem := make(chan struct{}, poolParallel)
	var wg sync.WaitGroup
	for i := range pods {
		pod := &pods[i]
		out[i] = nodeAnswer[T]{node: pod.Spec.NodeName, pod: pod.Name}
		if pod.Status.Phase != corev1.PodRunning {
			out[i].err = fmt.Errorf("agent pod %s is %s", pod.Name, pod.Status.Phase)
			continue
		}
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			actx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			client, closer, err := c.DialPod(actx, pod)
			if err != nil {
				out[i].err = err
				return
			}
			defer closer.Close()
			out[i].value, out[i].err = ask(actx, client)
		})
	}
	wg.Wait()
	return out, nil
}

// unreachable is the error after a pool table: how many nodes did not answer.
func unreachable[T any](answers []nodeAnswer[T]) error {
	n := 0
	for _, a := range answers {
		if a.err != nil {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	return fmt.Errorf("%d of %d nodes' agents did not answer", n, len(answers))
}

// statusSeverity rates a node's agent: critical when it cannot record (no answer, or its
// store not writable), warning with an incident open or events dropped, else ok.
func statusSeverity(st *agentv1.Status, err error) string {
	if err != nil || !st.GetStore().GetWritable() {
		return analyzer.SeverityCritical
	}
	var dropped uint64
	for _, d := range st.GetDrops() {
		dropped += d.GetCount()
	}
	if st.GetIncidentsOpen() > 0 || dropped > 0 {
		return analyzer.SeverityWarning
	}
	return "ok"
}

// poolStatus prints every node's agent's status, the worst first.
func poolStatus(cmd *cobra.Command, output string) error {
	answers, err := askPool(cmd, func(ctx context.Context, c agentv1.AgentClient) (*agentv1.Status, error) {
		return c.GetStatus(ctx, &agentv1.GetStatusRequest{})
	})
	if err != nil {
		return err
	}
	slices.SortStableFunc(answers, func(a, b nodeAnswer[*agentv1.Status]) int {
		return cmp.Or(cmp.Compare(analyzer.SeverityRank(statusSeverity(b.value, b.err)), analyzer.SeverityRank(statusSeverity(a.value, a.err))),
			cmp.Compare(a.node, b.node))
	})
	w := cmd.OutOrStdout()
	if output == "json" {
		type row struct {
			Node     string          `json:"node"`
			Pod      string          `json:"pod"`
			Severity string          `json:"severity"`
			Status   json.RawMessage `json:"status,omitempty"`
			Error    string          `json:"error,omitempty"`
		}
		rows := []row{}
		for _, a := range answers {
			r := row{Node: a.node, Pod: a.pod, Severity: statusSeverity(a.value, a.err)}
			if a.err != nil {
				r.Error = a.err.Error()
			} else if r.Status, err = protojson.Marshal(a.value); err != nil {
				return err
			}
			rows = append(rows, r)
		}
		if err := writeJSON(w, rows); err != nil {
			return err
		}
		return unreachable(answers)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tSEVERITY\tINCIDENTS OPEN/KEPT\tDROPPED\tSTORE\tCGROUPS\tRSS\tVERSION")
	for _, a := range answers {
		if a.err != nil {
			fmt.Fprintf(tw, "%s\t%s\t-\t-\t-\t-\t-\tunreachable: %v\n", a.node, statusSeverity(nil, a.err), a.err)
			continue
		}
		st := a.value
		var dropped uint64
		for _, d := range st.GetDrops() {
			dropped += d.GetCount()
		}
		store := fmt.Sprintf("%.0f MiB", float64(st.GetStore().GetBytes())/(1<<20))
		if !st.GetStore().GetWritable() {
			store = "NOT WRITABLE"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d/%d\t%d\t%s\t%d\t%.0f MiB\t%s\n", a.node, statusSeverity(st, nil), st.GetIncidentsOpen(), st.GetIncidentsTotal(),
			dropped, store, st.GetTrackedCgroups(), float64(st.GetRssBytes())/(1<<20), st.GetVersion())
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return unreachable(answers)
}

// poolIncident is one incident of a node, with its worst finding's severity.
type poolIncident struct {
	Node     string `json:"node"`
	Severity string `json:"severity,omitempty"`
	recorded.Incident
}

// poolIncidents prints every node's incidents, the most severe first, then the newest.
func poolIncidents(cmd *cobra.Command, since time.Time, limit int, output string) error {
	answers, err := askPool(cmd, func(ctx context.Context, c agentv1.AgentClient) ([]recorded.Incident, error) {
		return recorded.FromAgent(c, nil).Incidents(ctx, since, limit)
	})
	if err != nil {
		return err
	}
	all := []poolIncident{}
	for _, a := range answers {
		if a.err != nil {
			fmt.Fprintf(cmd.ErrOrStderr(), "nodectl: node %s: %v\n", a.node, a.err)
			continue
		}
		for _, in := range a.value {
			all = append(all, poolIncident{Node: a.node, Severity: incidentSeverity(in), Incident: in})
		}
	}
	slices.SortStableFunc(all, func(a, b poolIncident) int {
		return cmp.Or(cmp.Compare(analyzer.SeverityRank(b.Severity), analyzer.SeverityRank(a.Severity)), b.Opened.Compare(a.Opened))
	})
	if limit > 0 && len(all) > limit {
		all = all[:limit]
	}
	w := cmd.OutOrStdout()
	if output == "json" {
		if err := writeJSON(w, all); err != nil {
			return err
		}
		return unreachable(answers)
	}
	if len(all) == 0 {
		fmt.Fprintf(w, "no incidents on %d nodes\n", len(answers))
		return unreachable(answers)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tSEVERITY\tID\tOPENED\tTRIGGER\tWHERE\tSTATE\tFINDINGS")
	for _, in := range all {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", in.Node, cmp.Or(in.Severity, "-"), in.ID, in.Opened.Local().Format(time.RFC3339),
			in.Trigger, in.Where(), in.State, findingsLine(in.Incident))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return unreachable(answers)
}

// incidentSeverity is the worst severity of an incident's findings, "" before its analysis.
func incidentSeverity(in recorded.Incident) string {
	if in.Report == nil {
		return ""
	}
	return in.Report.Worst()
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
