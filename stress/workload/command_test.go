package workload

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestCommandRoundTrip encodes each workload with every setting away from its default and
// parses it back: a flag the encoder and the parser spell differently, or one the encoder
// leaves out, comes back as its default.
func TestCommandRoundTrip(t *testing.T) {
	tests := map[string]Config{
		"victim":       &VictimConfig{Dir: "/mnt/disk a", Interval: 1500 * time.Millisecond, WorkRounds: 7, WriteBytes: 3 << 20},
		"heartbeat":    &HeartbeatConfig{Period: 50 * time.Millisecond},
		"cpu_hog":      &CPUHogConfig{Threads: 3},
		"disk_hog":     &DiskHogConfig{Dir: "/mnt/disk", FileBytes: 1<<20 + 1},
		"fsync_hog":    &FsyncHogConfig{Dir: "/mnt/disk", BlockBytes: 512},
		"memory_hog":   &MemoryHogConfig{Bytes: 5 << 30},
		"churn":        &ChurnConfig{Parallel: 9},
		"wake":         &WakeConfig{BootRounds: 1, Pending: true},
		"sandbox":      &SandboxConfig{HeapBytes: 300 << 20, HotShare: 0.1, Binary: "/run/bin", BinaryShare: 1.0 / 3, Activity: 250 * time.Millisecond, BurstRounds: 0, Tick: 10 * time.Millisecond},
		"fsync_writer": &FsyncWriterConfig{Dir: "/mnt/disk", Bytes: 16 << 20},
	}
	covered := map[string]bool{}
	for _, c := range tests {
		covered[c.Name()] = true
	}
	for _, d := range defaults() {
		if !covered[d.Name()] {
			t.Errorf("workload %s has no round-trip case", d.Name())
		}
	}
	for name, cfg := range tests {
		t.Run(name, func(t *testing.T) {
			assertNoDefault(t, cfg)
			want := Command{Run: "20250101-000000-ab12", Config: cfg}
			args := want.Args()
			got, err := Parse(args)
			if err != nil {
				t.Fatalf("parsing %q: %v", args, err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("parsed %q as %+v, want %+v", args, got.Config, want.Config)
			}
		})
	}
}

// assertNoDefault fails when a setting of cfg equals its default, which a round trip could not
// tell from a dropped flag.
func assertNoDefault(t *testing.T, cfg Config) {
	t.Helper()
	for _, d := range defaults() {
		if d.Name() != cfg.Name() {
			continue
		}
		v, dv := reflect.ValueOf(cfg).Elem(), reflect.ValueOf(d).Elem()
		for i := range v.NumField() {
			if v.Field(i).Equal(dv.Field(i)) {
				t.Errorf("%s: %s is its default %v", cfg.Name(), v.Type().Field(i).Name, v.Field(i))
			}
		}
	}
}

// TestDefaultsRoundTrip: the defaults, an empty path included, survive the command line too.
func TestDefaultsRoundTrip(t *testing.T) {
	for _, d := range defaults() {
		want := Command{Config: d}
		got, err := Parse(want.Args())
		if err != nil {
			t.Fatalf("parsing %q: %v", want.Args(), err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("parsed %q as %+v, want %+v", want.Args(), got.Config, d)
		}
	}
}

func TestParseLeavesOutDefaults(t *testing.T) {
	c, err := Parse([]string{Group, "fsync-hog", "--dir", "/mnt/disk"})
	if err != nil {
		t.Fatal(err)
	}
	want := &FsyncHogConfig{Dir: "/mnt/disk", BlockBytes: DefaultFsyncHogBlockBytes}
	if !reflect.DeepEqual(c.Config, want) {
		t.Errorf("got %+v, want %+v", c.Config, want)
	}
}

// TestParseRejects: a bad command line fails before the workload starts, naming what is wrong.
func TestParseRejects(t *testing.T) {
	tests := map[string]struct {
		args []string
		want []string // in the error
	}{
		"unknown_flag":     {[]string{Group, "victim", "--speed", "9"}, []string{"victim", "--speed"}},
		"bad_duration":     {[]string{Group, "victim", "--interval", "soon"}, []string{"--interval", `"soon"`}},
		"bad_int":          {[]string{Group, "cpu-hog", "--threads", "many"}, []string{"--threads", `"many"`}},
		"bad_bytes":        {[]string{Group, "sandbox", "--memory", "1G"}, []string{"--memory", `"1G"`}},
		"bad_share":        {[]string{Group, "sandbox", "--hot-share", "half"}, []string{"--hot-share", `"half"`}},
		"missing_value":    {[]string{Group, "wake", "--boot-work"}, []string{"--boot-work"}},
		"stray_argument":   {[]string{Group, "churn", "--parallel", "2", "now"}, []string{"churn", `"now"`}},
		"unknown_workload": {[]string{Group, "gpu-hog"}, []string{`"gpu-hog"`}},
		"not_a_workload":   {[]string{"version"}, []string{`"version"`}},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := Parse(tt.args)
			if err == nil {
				t.Fatalf("parsing %q: no error", tt.args)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("parsing %q: error %q does not name %s", tt.args, err, w)
				}
			}
		})
	}
}
