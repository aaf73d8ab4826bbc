// Package agentv1 is the node agent's gRPC API, generated from agent.proto (`make generate-api`).
// The server is agent/rpc; docs/api.md describes the API.
package agentv1
