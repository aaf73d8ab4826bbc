package testvm

import (
	"slices"
	"testing"
)

func TestFailedTestsNameEachWithItsLastLine(t *testing.T) {
	r := &Result{Output: []string{
		"=== RUN   TestA",
		"    a_test.go:10: setting up",
		"    a_test.go:12: want 3, got 2",
		"--- FAIL: TestA (0.10s)",
		"=== RUN   TestB",
		"--- PASS: TestB (0.00s)",
		"=== RUN   TestC",
		"=== RUN   TestC/sub",
		"    c_test.go:5: no finding",
		"    cgtest.go:174: rmdir /sys/fs/cgroup/x: device or resource busy",
		"    --- FAIL: TestC/sub (1.00s)",
		"--- FAIL: TestC (1.00s)",
		"=== RUN   TestD",
		"--- FAIL: TestD (0.00s)",
		"FAIL",
	}}
	want := []string{
		"TestA: a_test.go:12: want 3, got 2",
		"TestC/sub: cgtest.go:174: rmdir /sys/fs/cgroup/x: device or resource busy",
		"TestC: cgtest.go:174: rmdir /sys/fs/cgroup/x: device or resource busy",
		"TestD: ",
	}
	if got := r.FailedTests(); !slices.Equal(got, want) {
		t.Errorf("FailedTests() =\n%q\nwant\n%q", got, want)
	}
}
