// Package layering holds the test that keeps the house map's import rules (docs/ARCHITECTURE.md,
// "Who may import whom") true: data flows one way, from the kernel to the report, and a
// package never imports one downstream of it.
package layering
