package stress

import (
	"strings"
	"testing"
)

func TestParseHog(t *testing.T) {
	tests := map[string]struct {
		in      string
		want    HogSpec
		wantErr string
	}{
		"cpu_default":         {in: "cpu", want: HogSpec{Kind: "cpu", Count: 1}},
		"cpu_count_limit":     {in: "cpu,count=2,cpu=500m", want: HogSpec{Kind: "cpu", Count: 2, CPUMilli: 500, CPURequestMilli: 500}},
		"request_below_limit": {in: "cpu,cpu=1,request=250m", want: HogSpec{Kind: "cpu", Count: 1, CPUMilli: 1000, CPURequestMilli: 250}},
		"request_no_limit":    {in: "cpu,request=2", want: HogSpec{Kind: "cpu", Count: 1, CPURequestMilli: 2000}},
		"request_over_limit":  {in: "cpu,cpu=500m,request=1", wantErr: "CPU request 1 is above the CPU limit 500m"},
		"bad_request":         {in: "cpu,request=-1", wantErr: "request=-1"},
		"disk_target":         {in: "disk,target=/mnt/x", want: HogSpec{Kind: "disk", Count: 1, Target: "/mnt/x"}},
		"churn_parallel":      {in: "churn,threads=4", want: HogSpec{Kind: "churn", Count: 1, Threads: 4}},
		"memory_default_cap":  {in: "memory", want: HogSpec{Kind: "memory", Count: 1, MemBytes: DefaultMemoryHog}},
		"memory_size":         {in: "memory,memory=1Gi", want: HogSpec{Kind: "memory", Count: 1, MemBytes: 1 << 30}},
		"unknown_kind":        {in: "gpu", wantErr: "unknown kind \"gpu\" (allowed: cpu, disk, memory, fsync, churn)"},
		"bad_limit":           {in: "cpu,cpu=lots", wantErr: "bad CPU limit"},
		"bad_size":            {in: "memory,memory=12xb", wantErr: "bad size"},
		"tiny_size":           {in: "memory,memory=10Ki", wantErr: "at least 1Mi"},
		"bad_count":           {in: "cpu,count=0", wantErr: "count=0"},
		"unknown_key":         {in: "cpu,speed=3", wantErr: "unknown key"},
		"relative_target":     {in: "disk,target=tmp", wantErr: "absolute"},
		"not_kv":              {in: "cpu,2", wantErr: "not key=value"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := ParseHog(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got.raw = ""
			if got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestThreadsFor(t *testing.T) {
	if got := threadsFor(HogSpec{CPUMilli: 1500}, 8); got != 2 {
		t.Errorf("threadsFor 1500m = %d", got)
	}
	if got := threadsFor(HogSpec{}, 8); got != 8 {
		t.Errorf("threadsFor unlimited = %d", got)
	}
}
