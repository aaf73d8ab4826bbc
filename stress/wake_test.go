package stress

import (
	"reflect"
	"strings"
	"testing"

	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/stress/workload"
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

// The limits take turns, so that a slow spell of the machine falls on every limit alike; each
// start's limit is requested as much, as a Guaranteed pod's CPU.
func TestWakePlanTakesTurns(t *testing.T) {
	ws := planWake(WakeConfig{CPULimits: []int64{50, 1000}, Count: 2, BootRounds: 3})
	var names []string
	for _, w := range ws {
		names = append(names, w.Name)
		if w.Kind != rundir.KindWake || w.Limits.CPUMilli != w.Limits.CPURequestMilli {
			t.Errorf("start %+v: want kind wake, its limit requested as much", w)
		}
		if c, ok := w.Config.(*workload.WakeConfig); !ok || c.BootRounds != 3 {
			t.Errorf("start %s: body %#v, want a wake of 3 boot rounds", w.Name, w.Config)
		}
	}
	if want := []string{"wake-50m-0", "wake-1-0", "wake-50m-1", "wake-1-1"}; !reflect.DeepEqual(names, want) {
		t.Errorf("starts %v, want %v", names, want)
	}
	if ws[0].CPU != "50m" || ws[3].Limits.CPUMilli != 1000 {
		t.Errorf("limits: %+v, %+v", ws[0], ws[3])
	}
}
