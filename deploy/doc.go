// Package deploy holds no code: its test renders the kustomize trees beside it (base/, the
// agent's DaemonSet and its RBAC; gke/, the overlay for GKE's Local SSD swap pools with the
// tuner) and checks what docs/deploy.md promises of them: no privileged container, exactly the
// measured capabilities, a read-only root filesystem, read-only host mounts but for the data
// and socket directories, least-privilege RBAC, and the image by its kustomize name.
package deploy
