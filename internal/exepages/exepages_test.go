//go:build linux

package exepages

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// childEnv makes this test binary the child TestReleaseGivesBackTheStartsPages watches.
const childEnv = "EXEPAGES_TEST_CHILD"

// TestMain runs the child when asked: it maps every page of its code and read-only data, as a
// start spread over them does, says where they are, releases them when told, says so, and
// then waits in a read, touching nothing more, until its standard input closes.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "" {
		os.Exit(m.Run())
	}
	ms, err := Mappings()
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	// A read of /proc/self/mem faults the pages in as a touch does.
	mem, err := os.Open("/proc/self/mem")
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	for _, m := range ms {
		if _, err := mem.ReadAt(make([]byte, m.End-m.Start), int64(m.Start)); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Printf("%x %x\n", m.Start, m.End)
	}
	fmt.Println("touched")
	in := bufio.NewReader(os.Stdin)
	in.ReadString('\n')
	if err := Release(); err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Println("released")
	io.Copy(io.Discard, in)
	os.Exit(0)
}

// TestReleaseGivesBackTheStartsPages watches a child (this binary) whose code and read-only
// data are all mapped release them: by its pagemap, only the pages it and its runtime ran
// since, and their neighbours the kernel maps with them, stay (27-54% of a test binary of 3
// MiB, whose runtime is a large part of it).
func TestReleaseGivesBackTheStartsPages(t *testing.T) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), childEnv+"=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer stdin.Close()
	out := bufio.NewScanner(stdout)
	next := func() string {
		if !out.Scan() {
			t.Fatalf("the child ended: %v", out.Err())
		}
		if l := out.Text(); !strings.HasPrefix(l, "error:") {
			return l
		}
		t.Fatalf("the child: %s", out.Text())
		return ""
	}
	var ms []Mapping
	for l := next(); l != "touched"; l = next() {
		var m Mapping
		if _, err := fmt.Sscanf(l, "%x %x", &m.Start, &m.End); err != nil {
			t.Fatalf("the child's line %q: %v", l, err)
		}
		ms = append(ms, m)
	}
	if len(ms) < 2 {
		t.Fatalf("mappings %+v: want the code's and the read-only data's at least", ms)
	}
	pagemap := fmt.Sprintf("/proc/%d/pagemap", cmd.Process.Pid)
	before, err := resident(pagemap, ms)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(stdin)
	if l := next(); l != "released" {
		t.Fatalf("the child said %q, want released", l)
	}
	after, err := resident(pagemap, ms)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the child's executable resident: %d KiB before, %d KiB after", before>>10, after>>10)
	if before == 0 || after*4 > before*3 {
		t.Errorf("resident %d bytes after releasing against %d before: want less than three quarters", after, before)
	}
}
