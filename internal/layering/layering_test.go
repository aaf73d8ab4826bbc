package layering

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/nodectl/nodectl/"

// rules says, by package (the longest matching prefix of its path in the module), which of the
// module's packages it may import; a prefix ending in "/" covers the packages below it.
// docs/ARCHITECTURE.md explains each line.
var rules = map[string][]string{
	// Errors of a bad setting, shared by every package below the CLI.
	"internal/badvalue": {},
	"internal/maproom":  {},
	// Tests' helper: a page opened in headless Chromium.
	"internal/browsertest": {},

	// The run format is the contract: it depends on nothing but the histogram it stores.
	"rundir": {"agent/hist"},

	// The node side, bottom up: shared plumbing, then the kernel's readers (tracers and
	// samplers), then the session that assembles them and the collector it feeds.
	"agent/hist":     {},
	"agent/host":     {},
	"agent/blockdev": {},
	"agent/swapfile": {},
	// Which pod and container a cgroup is: path forms, and the names the CRI and the API
	// server give their ids.
	"agent/kubeid":    {},
	"agent/cgroup":    {"agent/host"},
	"agent/daemons":   {"agent/cgroup", "agent/host"},
	"agent/trace":     {"agent/trace", "agent/hist", "agent/blockdev", "agent/cgroup", "rundir"},
	"agent/sample":    {"agent/cgroup", "agent/blockdev", "agent/host", "rundir"},
	"agent/collect":   {"rundir"},
	"agent/session":   {"agent/trace", "agent/sample", "agent/collect", "agent/cgroup", "agent/host", "rundir"},
	"agent/recording": {"agent/session", "agent/cgroup", "agent/host", "rundir"},
	// Exporters serve what the session reads; the flight recorder stores it.
	"agent/metricserver": {},
	"agent/exporter":     {"agent/hist", "agent/kubeid", "rundir"},
	"agent/flightrec":    {"agent/hist", "rundir"},
	// The agent's API: its protobufs depend on nothing; its server and client on the records.
	"api/agent/v1":    {},
	"agent/apiserver": {"agent/hist", "rundir", "api/agent/v1"},
	// Kubernetes' view of the node: the CRI (containers to pods) and the API server (pods,
	// the node's Lease and Node). Readers of their own, for the agent to join with cgroups.
	"agent/cri":  {},
	"agent/kube": {},
	// The readers' API over client-go's fake, for tests only.
	"agent/kube/kubefake": {},

	// The always-on agent assembles the node side, the flight recorder, the API and the
	// exporter, and runs the analyzer on its incidents; it names pods through agent/cri and
	// agent/kube.
	"agentd": {"agent/", "analyzer", "rundir", "api/agent/v1"},

	// The analyzer reads runs offline: never the node.
	"analyzer": {"agent/hist", "rundir"},

	// Reports render the analyzer's tables and a run's records; they never read the node.
	"report": {"report/", "analyzer", "agent/hist", "rundir"},

	// The tuner changes the node through the agent's plumbing; it neither runs workloads nor
	// analyzes.
	"tuner": {"tuner", "agent/cgroup", "agent/daemons", "agent/host", "agent/swapfile", "agent/metricserver"},
	// Validation runs a stress scenario before and after a profile and compares the runs.
	"tuner/validate": {"tuner", "stress", "analyzer", "agent/", "rundir"},

	// Scenarios drive workloads and record them; they honour the tuner's state and change
	// host settings through its backends, but leave explaining to the analyzer.
	"stress": {"stress", "agent/", "rundir", "tuner"},

	// Commands may use everything below them, but not each other, except through clix and
	// the main package that assembles them.
	"cli/":        {"agent/", "agentd", "api/agent/v1", "analyzer", "report", "rundir", "stress", "tuner", "cli/internal/"},
	"cli/nodectl": {"cli/", "agent/", "agentd", "analyzer", "report", "rundir", "stress", "tuner"},
	// Benchmarks run the real binary; the post-mortem one also analyzes in process.
	"bench/": {"agent/", "agentd", "bench/internal/"},

	// The cluster tests' harness (a real control plane and kubelet) stands apart: it runs
	// Kubernetes, not nodectl, so the code under test cannot lean on it.
	"testcluster": {},
	// The VM lane builds the test binaries and boots them; it imports nothing of nodectl's.
	"testvm": {},
	// Build tools (make image) wrap the binary; they import nothing of nodectl's.
	"build/": {},
	// deploy/ holds manifests; its test renders them with kustomize.
	"deploy": {},
}

// everyone may import these: they depend on nothing of the module.
var everyone = []string{"internal/badvalue", "internal/maproom"}

// ruleFor is the rule of the longest prefix matching pkg.
func ruleFor(pkg string) (string, []string, bool) {
	best := ""
	for prefix := range rules {
		if covers(prefix, pkg) && len(prefix) > len(best) {
			best = prefix
		}
	}
	allowed, ok := rules[best]
	return best, allowed, ok
}

// covers says whether prefix names pkg: the package itself or, with a trailing "/" or as a
// path element, the packages below it.
func covers(prefix, pkg string) bool {
	if strings.HasSuffix(prefix, "/") {
		return strings.HasPrefix(pkg, prefix)
	}
	return pkg == prefix || strings.HasPrefix(pkg, prefix+"/")
}

func TestImportsFollowTheHouseMap(t *testing.T) {
	root := filepath.Join("..", "..")
	fset := token.NewFileSet()
	seen := map[string]bool{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() != ".." && strings.HasPrefix(d.Name(), ".") {
			return filepath.SkipDir // .git, .scratch
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		rel, _ := filepath.Rel(root, filepath.Dir(path))
		pkg := filepath.ToSlash(rel)
		if strings.HasPrefix(pkg, "internal/layering") {
			return nil
		}
		prefix, allowed, ok := ruleFor(pkg)
		if !ok {
			if !seen[pkg] {
				t.Errorf("package %s has no import rule: add it here and to docs/ARCHITECTURE.md", pkg)
				seen[pkg] = true
			}
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			dep, ok := strings.CutPrefix(p, module)
			if !ok || dep == pkg || covers(pkg, dep) || slices.Contains(everyone, dep) {
				continue // outside the module, the package's own internals, or shared by all
			}
			if !slices.ContainsFunc(allowed, func(a string) bool { return covers(a, dep) }) {
				t.Errorf("%s imports %s, which the rule for %s does not allow (allowed: %s)", path, dep, prefix, strings.Join(allowed, ", "))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// The rules themselves: the prefixes match what they should.
func TestRuleFor(t *testing.T) {
	for pkg, want := range map[string]string{
		"agent/trace/runq": "agent/trace",
		"cli/stress":       "cli/",
		"cli/nodectl":      "cli/nodectl",
		"tuner/cpuset":     "tuner",
		"tuner/validate":   "tuner/validate",
		"stress/launch":    "stress",
		"rundir":           "rundir",
	} {
		if got, _, _ := ruleFor(pkg); got != want {
			t.Errorf("rule for %s is %q, want %q", pkg, got, want)
		}
	}
}
