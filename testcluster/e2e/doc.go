// Package e2e runs nodectl's agent as the DaemonSet of deploy/ on a real control plane and a
// real kubelet (package testcluster), and checks what issue 13 asks of it: its privileges, pods
// named in its metrics and findings, late Lease renewals explained, restarts with its data, and
// a ServiceAccount that reads nothing more than it needs. `make test-cluster` runs it.
package e2e
