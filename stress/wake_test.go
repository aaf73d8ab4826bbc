package stress

import (
	"reflect"
	"strings"
	"testing"

	"github.com/nodectl/nodectl/rundir"
)

func TestParseCPULimits(t *testing.T) {
	tests := map[string]struct {
		in      []string
		want    []int64
		wantErr string
	}{
		"default":        {in: DefaultWakeLimits, want: []int64{50, 250, 1000}},
		"order_kept":     {in: []string{"1", "50m"}, want: []int64{1000, 50}},
		"decimal":        {in: []string{"0.5", " 2 "}, want: []int64{500, 2000}},
		"smallest":       {in: []string{"10m"}, want: []int64{10}},
		"none":           {in: nil, wantErr: "CPULimits: give at least one CPU limit"},
		"bad":            {in: []string{"50m", "fast"}, wantErr: `CPULimits: bad CPU limit "fast"`},
		"below_quota":    {in: []string{"5m"}, wantErr: "CPULimits: 5m is below 10m"},
		"zero":           {in: []string{"0"}, wantErr: "CPULimits: bad CPU limit \"0\""},
		"same_limit":     {in: []string{"50m", "0.05"}, wantErr: "50m and 0.05 are the same limit"},
		"empty_in_list":  {in: []string{"50m", ""}, wantErr: `bad CPU limit ""`},
		"over_1024_cpus": {in: []string{"2000"}, wantErr: "more than 1024 CPUs"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := ParseCPULimits(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("ParseCPULimits(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
			}
		})
	}
}

// The limits take turns, so that a slow spell of the machine falls on every limit alike.
func TestWakePlanTakesTurns(t *testing.T) {
	r := &wakeRun{runHost: runHost{id: "wake-20260101-120000-a1b2c3"}, cfg: WakeConfig{CPULimits: []int64{50, 1000}, Count: 2}}
	r.plan()
	var names []string
	for _, w := range r.workloads {
		names = append(names, w.Name)
		if w.Kind != rundir.KindWake || w.Cgroup != RunCgroup(r.id)+"/"+w.Name {
			t.Errorf("start %+v: want kind wake in cgroup %s/%s", w, RunCgroup(r.id), w.Name)
		}
	}
	if want := []string{"wake-50m-0", "wake-1-0", "wake-50m-1", "wake-1-1"}; !reflect.DeepEqual(names, want) {
		t.Errorf("starts %v, want %v", names, want)
	}
	if r.workloads[0].CPU != "50m" || r.limits["wake-1-1"] != 1000 {
		t.Errorf("limits: %+v, %v", r.workloads[0], r.limits)
	}
}
