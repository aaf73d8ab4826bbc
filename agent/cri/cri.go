// Package cri asks the node's container runtime, through the CRI on its unix socket, which pod
// sandbox each container belongs to and which runtime handler runs it. The cgroup paths name
// containers by id only; this is what turns an id into a pod and a container name.
package cri

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

const (
	// dialTimeout bounds Dial's first call: a socket nobody answers on fails it instead of
	// leaving the agent waiting.
	dialTimeout = 5 * time.Second
	// callTimeout bounds each list call when the caller's context has no earlier deadline.
	callTimeout = 10 * time.Second
	// maxMsgSize is the kubelet's own limit for CRI answers: a node with thousands of
	// containers answers ListContainers with more than grpc's default 4 MiB.
	maxMsgSize = 16 << 20
)

// Container is one container the runtime knows, in any state.
type Container struct {
	ID, Name, PodSandboxID string
}

// Sandbox is one pod sandbox the runtime knows, in any state.
type Sandbox struct {
	ID, PodUID, PodName, PodNamespace, RuntimeHandler string
}

// Client talks to one runtime's CRI socket.
type Client struct {
	socket string
	conn   *grpc.ClientConn
	rt     runtimeapi.RuntimeServiceClient
}

// Dial connects to the CRI runtime service on socket (a path, or a unix:// address) and checks
// that it answers, within a bounded time.
func Dial(ctx context.Context, socket string) (*Client, error) {
	target := socket
	if socket == "" {
		return nil, errors.New("dialing the CRI: no socket given")
	}
	if target[0] == '/' {
		target = "unix://" + target
	}
	conn, err := grpc.NewClient(target,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMsgSize)))
	if err != nil {
		return nil, fmt.Errorf("dialing the CRI on %s: %w", socket, err)
	}
	c := &Client{socket: socket, conn: conn, rt: runtimeapi.NewRuntimeServiceClient(conn)}
	vctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	// WaitForReady: a runtime that is still creating its socket gets the whole timeout.
	if _, err := c.rt.Version(vctx, &runtimeapi.VersionRequest{}, grpc.WaitForReady(true)); err != nil {
		conn.Close()
		return nil, fmt.Errorf("asking the CRI on %s for its version: %w", socket, err)
	}
	return c, nil
}

// Close closes the connection.
func (c *Client) Close() error {
	if c == nil || c.conn == nil {
		return nil
	}
	err := c.conn.Close()
	c.conn = nil
	return err
}

// Snapshot is what the runtime listed at one moment: every container and sandbox, whatever
// their state, by id.
type Snapshot struct {
	Time       time.Time
	containers map[string]Container
	sandboxes  map[string]Sandbox
}

// Snapshot lists all containers and all sandboxes, one call each. Exited ones are kept: a
// cgroup can outlive its container's exit by a moment and still deserves its name.
func (c *Client) Snapshot(ctx context.Context) (*Snapshot, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	cs, err := c.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		return nil, fmt.Errorf("listing containers on %s: %w", c.socket, err)
	}
	ss, err := c.rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return nil, fmt.Errorf("listing pod sandboxes on %s: %w", c.socket, err)
	}
	s := &Snapshot{
		Time:       time.Now(),
		containers: make(map[string]Container, len(cs.GetContainers())),
		sandboxes:  make(map[string]Sandbox, len(ss.GetItems())),
	}
	for _, ct := range cs.GetContainers() {
		s.containers[ct.GetId()] = Container{
			ID:           ct.GetId(),
			Name:         ct.GetMetadata().GetName(),
			PodSandboxID: ct.GetPodSandboxId(),
		}
	}
	for _, sb := range ss.GetItems() {
		md := sb.GetMetadata()
		s.sandboxes[sb.GetId()] = Sandbox{
			ID:             sb.GetId(),
			PodUID:         md.GetUid(),
			PodName:        md.GetName(),
			PodNamespace:   md.GetNamespace(),
			RuntimeHandler: sb.GetRuntimeHandler(),
		}
	}
	return s, nil
}

// Container is the container with id and its sandbox. ok is false when the container is
// unknown; a known container whose sandbox was not listed comes with a zero Sandbox.
func (s *Snapshot) Container(id string) (Container, Sandbox, bool) {
	ct, ok := s.containers[id]
	if !ok {
		return Container{}, Sandbox{}, false
	}
	return ct, s.sandboxes[ct.PodSandboxID], true
}

// Sandbox is the sandbox with id: a sandbox's own (pause) cgroup is named by it.
func (s *Snapshot) Sandbox(id string) (Sandbox, bool) {
	sb, ok := s.sandboxes[id]
	return sb, ok
}

// Len is how many containers and sandboxes the snapshot holds.
func (s *Snapshot) Len() (containers, sandboxes int) {
	return len(s.containers), len(s.sandboxes)
}
