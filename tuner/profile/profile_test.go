package profile

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/nodectl/nodectl/tuner/journald"
	"github.com/nodectl/nodectl/tuner/kubelet"
)

// resolve parses a nodectl- or GKE-format profile and resolves it on node n.
func resolve(t *testing.T, src string, n Node) (*Profile, error) {
	t.Helper()
	p, err := Parse([]byte(src), "test.yaml")
	if err != nil {
		return nil, err
	}
	return p.Resolve(n)
}

// wantErr checks that err holds every fragment.
func wantErr(t *testing.T, err error, fragments ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want one containing %q", fragments)
	}
	for _, f := range fragments {
		if !strings.Contains(err.Error(), f) {
			t.Errorf("error %q\ndoes not contain %q", err, f)
		}
	}
}

func TestBuiltinSizedByCPUs(t *testing.T) {
	for name, tc := range map[string]struct {
		cpus    int
		online  string
		want    string
		wantErr []string
	}{
		"cpus_1":  {cpus: 1, wantErr: []string{"reservedSystemCPUs.cpus", "the node has 1 CPU(s)", "built-in sandbox-density"}},
		"cpus_2":  {cpus: 2, want: "0"},
		"cpus_3":  {cpus: 3, want: "0"},
		"cpus_4":  {cpus: 4, want: "0"},
		"cpus_5":  {cpus: 5, want: "0-1"},
		"cpus_8":  {cpus: 8, want: "0-1"},
		"cpus_32": {cpus: 32, want: "0-7"},
		"cpus_0":  {cpus: 0, wantErr: []string{"reservedSystemCPUs.cpus", "CPU count is unknown"}},
		// Node.Online wins: the lowest online CPUs are reserved.
		"online_2_to_9": {cpus: 8, online: "2-9", want: "2-3"},
	} {
		t.Run(name, func(t *testing.T) {
			b, err := Builtin("sandbox-density")
			if err != nil {
				t.Fatal(err)
			}
			r, err := b.Resolve(Node{CPUs: tc.cpus, Online: tc.online})
			if tc.wantErr != nil {
				wantErr(t, err, tc.wantErr...)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r.ReservedCPUs.CPUs != tc.want {
				t.Errorf("reserved CPUs on %d CPUs = %q, want %q", tc.cpus, r.ReservedCPUs.CPUs, tc.want)
			}
			if b.ReservedCPUs.CPUs != AutoCPUs {
				t.Errorf("Resolve changed its input: cpus = %q", b.ReservedCPUs.CPUs)
			}
		})
	}
}

func TestBuiltinContent(t *testing.T) {
	if got := Builtins(); !slices.Equal(got, []string{"sandbox-density"}) {
		t.Fatalf("Builtins() = %v", got)
	}
	_, err := Builtin("nope")
	wantErr(t, err, `"nope"`, "sandbox-density")

	b, _ := Builtin("sandbox-density")
	want := map[string]string{
		"net.ipv4.neigh.default.gc_thresh1": "2048", "net.ipv4.neigh.default.gc_thresh2": "4096",
		"net.ipv4.neigh.default.gc_thresh3": "8192", "net.ipv6.neigh.default.gc_thresh1": "2048",
		"net.ipv6.neigh.default.gc_thresh2": "4096", "net.ipv6.neigh.default.gc_thresh3": "8192",
		"vm.swappiness": "100", "vm.watermark_scale_factor": "500",
	}
	if !reflect.DeepEqual(b.Sysctl, want) {
		t.Errorf("sysctl = %v, want %v", b.Sysctl, want)
	}
	wantJ := &Journald{DropIn: journald.DefaultDropIn,
		Settings: []Entry{{"SystemMaxUse", "500M"}, {"RateLimitIntervalSec", "30s"}, {"RateLimitBurst", "1000"}},
		Storage:  "/var/lib/containerd/systemd-journal"}
	if !reflect.DeepEqual(b.Journald, wantJ) {
		t.Errorf("journald = %+v, want %+v", b.Journald, wantJ)
	}
	wantR := &ReservedCPUs{CPUs: "auto", KubeletDropIn: kubelet.DefaultDropIn, SystemCgroups: []string{"system.slice"},
		WorkloadCgroups: []string{"kubepods.slice", "kubepods"},
		Daemons:         []string{"kubelet", "containerd", "crio", "dockerd", "systemd-journald"}}
	if !reflect.DeepEqual(b.ReservedCPUs, wantR) {
		t.Errorf("reservedSystemCPUs = %+v, want %+v", b.ReservedCPUs, wantR)
	}
	if b.Swap != nil || b.Source != SourceBuiltin {
		t.Errorf("swap = %+v, source = %q; want no swap, source built-in", b.Swap, b.Source)
	}
	// Each call is a fresh copy: changing one leaves the next alone.
	b.Sysctl["vm.swappiness"] = "1"
	b.ReservedCPUs.Daemons[0] = "x"
	c, _ := Builtin("sandbox-density")
	if c.Sysctl["vm.swappiness"] != "100" || c.ReservedCPUs.Daemons[0] != "kubelet" {
		t.Error("Builtin returned shared state")
	}
}

func TestParseRefuses(t *testing.T) {
	for name, tc := range map[string]struct {
		src  string
		want []string
	}{
		"not_yaml":             {"name: [x\n", []string{"test.yaml", "not valid YAML"}},
		"empty_file":           {"", []string{"empty profile"}},
		"top_not_mapping":      {"- a\n", []string{"want a mapping", "got a list"}},
		"unknown_top_key":      {"name: x\nsysctls: {}\n", []string{"test.yaml:2: sysctls: unknown key", "allowed here are name, description, extends, sysctl"}},
		"unknown_journald_key": {"journald: {dropin: /x}\n", []string{"journald.dropin: unknown key", "dropIn, settings, storage"}},
		"unknown_reserved_key": {"reservedSystemCPUs:\n  cpu: 0-1\n", []string{"test.yaml:2: reservedSystemCPUs.cpu: unknown key", "cpus, kubeletDropIn"}},
		"unknown_swap_key":     {"swap: {file: /s, sizeGib: 8}\n", []string{"swap.sizeGib: unknown key", "file, device, size, priority, enabled"}},
		"duplicate_key":        {"name: a\nname: b\n", []string{"test.yaml:2: name: written twice (first at line 1)"}},
		"name_not_string":      {"name: [a]\n", []string{"name: want a string, got a list"}},
		"sysctl_not_mapping":   {"sysctl: [vm.swappiness]\n", []string{"sysctl: want a mapping, got a list"}},
		"sysctl_bool":          {"sysctl:\n  vm.swappiness: true\n", []string{"test.yaml:2: sysctl.vm.swappiness: want a number or a string, got the boolean true"}},
		"sysctl_float":         {"sysctl:\n  vm.swappiness: 1.5\n", []string{"want a number or a string, got the number 1.5"}},
		"sysctl_list":          {"sysctl:\n  vm.swappiness: [1]\n", []string{"got a list"}},
		"sysctl_empty_string":  {"sysctl:\n  vm.swappiness: ' '\n", []string{"empty value"}},
		"settings_list":        {"journald: {settings: [SystemMaxUse=1G]}\n", []string{"journald.settings: want a mapping, got a list"}},
		"settings_value_map":   {"journald: {settings: {SystemMaxUse: {a: 1}}}\n", []string{"journald.settings.SystemMaxUse: want a value"}},
		"cpus_list":            {"reservedSystemCPUs: {cpus: [0, 1]}\n", []string{"reservedSystemCPUs.cpus: want a string, got a list"}},
		"daemons_not_list":     {"reservedSystemCPUs: {daemons: kubelet}\n", []string{"reservedSystemCPUs.daemons: want a list of strings"}},
		"daemons_entry_number": {"reservedSystemCPUs: {daemons: [kubelet, 7]}\n", []string{"reservedSystemCPUs.daemons[1]: want a string, got the number 7"}},
		"swap_size_syntax":     {"swap: {file: /s, size: 8GB}\n", []string{`swap.size: "8GB" is not a size`, "512Mi or 8Gi"}},
		"swap_size_fraction":   {"swap: {file: /s, size: 0.5}\n", []string{`"0.5" is not a whole number of bytes`}},
		"swap_size_too_small":  {"swap: {file: /s, size: 4096}\n", []string{"at least 1Mi"}},
		"swap_size_bool":       {"swap: {file: /s, size: true}\n", []string{"swap.size: want a size, got the boolean true"}},
		"swap_priority_string": {"swap: {file: /s, size: 1Gi, priority: high}\n", []string{"swap.priority: want an integer from -1", `got "high"`}},
		"swap_enabled_string":  {"swap: {file: /s, size: 1Gi, enabled: 'yes'}\n", []string{"swap.enabled: want true or false"}},
		"all_problems_joined": {"bogus: 1\nsysctl:\n  vm.swappiness: true\nswap: {size: 8GB}\n",
			[]string{"test.yaml:1: bogus", "test.yaml:3: sysctl.vm.swappiness", "test.yaml:4: swap.size"}},
	} {
		t.Run(name, func(t *testing.T) {
			p, err := Parse([]byte(tc.src), "test.yaml")
			wantErr(t, err, tc.want...)
			if p != nil {
				t.Errorf("Parse returned a profile with its error")
			}
		})
	}
}

// A file given by mistake (--profile /etc/passwd) is named by its start, not echoed whole.
func TestParseQuotesAnExcerpt(t *testing.T) {
	src := strings.Repeat("root:x:0:0:root:/root:/bin/bash\n", 200)
	_, err := Parse([]byte(src), "passwd")
	wantErr(t, err, `got "root:x:0:0:root:/root:/bin/bash root:x:0…"`)
	if err != nil && len(err.Error()) > 300 {
		t.Errorf("the error quotes %d bytes of the file:\n%.400s", len(err.Error()), err)
	}
}

func TestResolveRefuses(t *testing.T) {
	two := Node{CPUs: 2}
	for name, tc := range map[string]struct {
		src  string
		node Node
		want []string
	}{
		"gc_thresh1_above_gc_thresh3": {"extends: sandbox-density\nsysctl:\n  net.ipv4.neigh.default.gc_thresh1: 9000\n", Node{CPUs: 8},
			[]string{"test.yaml:3: sysctl.net.ipv4.neigh.default.gc_thresh1", "gc_thresh1 = 9000 is above gc_thresh3 = 8192", "gc_thresh1 <= gc_thresh2 <= gc_thresh3"}},
		"gc_thresh2_above_gc_thresh3_ipv6": {"sysctl:\n  net.ipv6.neigh.default.gc_thresh2: 10\n  net.ipv6.neigh.default.gc_thresh3: 5\n", two,
			[]string{"net.ipv6.neigh.default.gc_thresh2", "gc_thresh2 = 10 is above gc_thresh3 = 5"}},
		"gc_thresh_inherited_key_blamed_on_the_written_one": {"extends: sandbox-density\nsysctl:\n  net.ipv4.neigh.default.gc_thresh3: 1024\n", Node{CPUs: 8},
			[]string{"test.yaml:3: sysctl.net.ipv4.neigh.default.gc_thresh3", "gc_thresh1 = 2048 is above gc_thresh3 = 1024"}},
		"gc_thresh_negative":     {"sysctl:\n  net.ipv4.neigh.default.gc_thresh1: -1\n", two, []string{"-1 is out of range: allowed are integers from 0 to 2147483647"}},
		"gc_thresh_not_integer":  {"sysctl:\n  net.ipv4.neigh.default.gc_thresh1: lots\n", two, []string{`"lots" is not an integer: allowed are integers from 0 to 2147483647`}},
		"swappiness_300":         {"extends: sandbox-density\nsysctl:\n  vm.swappiness: 300\n", Node{CPUs: 8}, []string{"test.yaml:3: sysctl.vm.swappiness: 300 is out of range: allowed are integers from 0 to 200"}},
		"swappiness_negative":    {"sysctl: {vm.swappiness: -1}\n", two, []string{"vm.swappiness: -1 is out of range"}},
		"swappiness_text":        {"sysctl: {vm.swappiness: 'high'}\n", two, []string{`vm.swappiness: "high" is not an integer`}},
		"watermark_scale_zero":   {"sysctl: {vm.watermark_scale_factor: 0}\n", two, []string{"vm.watermark_scale_factor: 0 is out of range: allowed are integers from 1 to 3000"}},
		"watermark_scale_3001":   {"sysctl: {vm.watermark_scale_factor: 3001}\n", two, []string{"3001 is out of range"}},
		"sysctl_key_not_dotted":  {"sysctl: {swappiness: 1}\n", two, []string{"sysctl.swappiness: not a sysctl key"}},
		"sysctl_key_dotdot":      {"sysctl: {vm..swappiness: 1}\n", two, []string{"not a sysctl key"}},
		"sysctl_key_slash_parts": {"sysctl: {net.//.x: 1}\n", two, []string{"not a sysctl key"}},
		"sysctl_missing_on_node_slash_name": {"sysctl: {net.ipv4.conf.eth0/100.rp_filter: 1}\n", Node{CPUs: 2, SysctlExists: func(string) bool { return false }},
			[]string{"no /proc/sys/net/ipv4/conf/eth0.100/rp_filter"}},
		"sysctl_missing_on_node": {"sysctl: {net.ipv6.neigh.default.gc_thresh1: 1, vm.swappiness: 1}\n",
			Node{CPUs: 2, SysctlExists: func(k string) bool { return !strings.HasPrefix(k, "net.ipv6.") }},
			[]string{"net.ipv6.neigh.default.gc_thresh1: the node has no such sysctl (no /proc/sys/net/ipv6/neigh/default/gc_thresh1)"}},
		"cpus_beyond_node": {"extends: sandbox-density\nreservedSystemCPUs: {cpus: 0-63}\n", two,
			[]string{"test.yaml:2: reservedSystemCPUs.cpus", `"0-63" names CPU(s) 2-63, which the node does not have: it has 2 CPU(s) (0-1)`}},
		"cpus_offline":       {"reservedSystemCPUs: {cpus: '1'}\n", Node{CPUs: 3, Online: "0,2-3"}, []string{`"1" names CPU(s) 1, which the node does not have: it has 3 CPU(s) (0,2-3)`}},
		"node_online_bad":    {"reservedSystemCPUs: {cpus: '1'}\n", Node{CPUs: 3, Online: "x"}, []string{`the node's online CPU list "x" is not a CPU list`}},
		"cpus_leave_none":    {"reservedSystemCPUs: {cpus: '0-1'}\n", two, []string{`"0-1" reserves all 2 CPU(s) of the node: at least one must be left for workloads`}},
		"cpus_not_a_list":    {"reservedSystemCPUs: {cpus: 'two'}\n", two, []string{`"two" is not a CPU list: want auto or a list`}},
		"cpus_empty":         {"reservedSystemCPUs: {cpus: ''}\n", two, []string{`"" is not a CPU list`}},
		"cpus_auto_one_cpu":  {"reservedSystemCPUs: {}\n", Node{CPUs: 1}, []string{"test.yaml:1: reservedSystemCPUs.cpus: auto reserves", "the node has 1 CPU(s)"}},
		"kubelet_dropin_rel": {"reservedSystemCPUs: {kubeletDropIn: kubelet.conf.d/x.conf}\n", two, []string{"reservedSystemCPUs.kubeletDropIn: want an absolute path ending in .conf"}},
		"kubelet_dropin_ext": {"reservedSystemCPUs: {kubeletDropIn: /etc/kubernetes/kubelet.conf.d/x.yaml}\n", two, []string{"ending in .conf"}},
		"cgroup_absolute":    {"reservedSystemCPUs: {systemCgroups: [/system.slice]}\n", two, []string{`reservedSystemCPUs.systemCgroups[0]: "/system.slice" is not a cgroup name`}},
		"cgroup_dotdot":      {"reservedSystemCPUs: {workloadCgroups: [../x]}\n", two, []string{"reservedSystemCPUs.workloadCgroups[0]"}},
		"cgroup_in_both":     {"reservedSystemCPUs: {systemCgroups: [a], workloadCgroups: [a]}\n", two, []string{`cgroup "a" is in both`}},
		"daemon_with_slash":  {"reservedSystemCPUs: {daemons: [/usr/bin/kubelet]}\n", two, []string{`reservedSystemCPUs.daemons[0]: "/usr/bin/kubelet" is not a process name`}},
		"journald_unknown_setting": {"extends: sandbox-density\njournald:\n  settings:\n    SystemMaxUsage: 1G\n", Node{CPUs: 8},
			[]string{"test.yaml:4: journald.settings.SystemMaxUsage: not a [Journal] setting of journald.conf(5): allowed are Audit, Compress"}},
		"journald_bad_size":     {"journald: {settings: {SystemMaxUse: 1GB}}\n", two, []string{`journald.settings.SystemMaxUse: "1GB" is not valid: want a size in bytes`}},
		"journald_bad_timespan": {"journald: {settings: {RateLimitIntervalSec: 30 parsecs}}\n", two, []string{`"30 parsecs" is not valid: want a time span`}},
		"journald_bad_uint":     {"journald: {settings: {RateLimitBurst: -5}}\n", two, []string{`"-5" is not valid: want a whole number`}},
		"journald_bad_bool":     {"journald: {settings: {ForwardToSyslog: perhaps}}\n", two, []string{"want yes or no"}},
		"journald_bad_level":    {"journald: {settings: {MaxLevelStore: loud}}\n", two, []string{"want a log level"}},
		"journald_storage_rel":  {"journald: {storage: var/journal}\n", two, []string{`journald.storage: want an absolute directory on the node, or "" to leave storage alone; got "var/journal"`}},
		"journald_dropin_dir":   {"journald: {dropIn: /etc/systemd/90.conf, storage: /s}\n", two, []string{`journald.dropIn: "/etc/systemd/90.conf" is not a journald drop-in`}},
		"journald_dropin_rel":   {"journald: {dropIn: journald.conf.d/90.conf, storage: /s}\n", two, []string{"is not a journald drop-in"}},
		"journald_sets_nothing": {"journald: {}\n", two, []string{"journald: sets nothing"}},
		"swap_file_and_device":  {"swap: {file: /var/swap, device: /dev/sdb, size: 1Gi}\n", two, []string{`swap: file "/var/swap" and device "/dev/sdb" are both set`}},
		"swap_file_no_size":     {"swap: {file: /var/swap}\n", two, []string{"swap.size: a swap file needs a size"}},
		"swap_device_with_size": {"swap: {device: /dev/sdb, size: 1Gi}\n", two, []string{"swap.size: size is for a swap file only"}},
		"swap_file_relative":    {"swap: {file: var/swap, size: 1Gi}\n", two, []string{`swap.file: want an absolute path on the node, got "var/swap"`}},
		"swap_device_relative":  {"swap: {device: sdb}\n", two, []string{`swap.device: want an absolute device path`}},
		"swap_priority_low":     {"swap: {device: /dev/sdb, priority: -2}\n", two, []string{"swap.priority: -2 is out of range: allowed are -1 (the kernel's default) to 32767"}},
		"swap_priority_high":    {"swap: {device: /dev/sdb, priority: 32768}\n", two, []string{"32768 is out of range"}},
		"extends_unknown":       {"extends: sandbox\n", two, []string{`test.yaml:1: extends: "sandbox" is not a built-in profile: allowed are sandbox-density`}},
		"profile_sets_nothing":  {"name: empty\n", two, []string{"test.yaml: sets nothing: give at least one of sysctl"}},
		"everything_removed":    {"extends: sandbox-density\nsysctl: null\njournald: null\nreservedSystemCPUs: null\n", two, []string{"test.yaml: sets nothing"}},
		"name_empty":            {"name: ''\nsysctl: {vm.swappiness: 1}\n", two, []string{"name: want a one-line name"}},
		"all_problems_joined": {"extends: sandbox-density\nsysctl:\n  vm.swappiness: 300\nreservedSystemCPUs: {cpus: 0-63}\nswap: {file: /s, device: /dev/sdb}\n", two,
			[]string{"test.yaml:3: sysctl.vm.swappiness", "test.yaml:4: reservedSystemCPUs.cpus", "test.yaml:5: swap: file"}},
	} {
		t.Run(name, func(t *testing.T) {
			p, err := resolve(t, tc.src, tc.node)
			wantErr(t, err, tc.want...)
			if p != nil {
				t.Errorf("Resolve returned a profile with its error")
			}
		})
	}
}

func TestResolveProblemsAreProblems(t *testing.T) {
	_, err := resolve(t, "sysctl: {vm.swappiness: 300}\nswap: {device: sdb}\n", Node{CPUs: 2})
	var n int
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var pr *Problem
		if !errors.As(e, &pr) || pr.Source != "test.yaml" || pr.Line == 0 || pr.Path == "" {
			t.Errorf("problem %#v lacks source, line or path", e)
		}
		n++
	}
	if n != 2 {
		t.Errorf("got %d problems, want 2: %v", n, err)
	}
}

func TestMerge(t *testing.T) {
	eight := Node{CPUs: 8}
	base, _ := Builtin("sandbox-density")
	base, err := base.Resolve(eight)
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		src   string
		check func(t *testing.T, p *Profile)
	}{
		"nothing_overridden_equals_builtin": {"extends: sandbox-density\n", func(t *testing.T, p *Profile) {
			if !reflect.DeepEqual(p.Sysctl, base.Sysctl) || !reflect.DeepEqual(p.Journald, base.Journald) ||
				!reflect.DeepEqual(p.ReservedCPUs, base.ReservedCPUs) || p.Swap != nil {
				t.Errorf("got %+v, want the built-in %+v", p, base)
			}
			if p.Name != "test" || p.Description != base.Description || p.Source != "test.yaml" || p.Extends != "sandbox-density" {
				t.Errorf("name %q, description %q, source %q, extends %q", p.Name, p.Description, p.Source, p.Extends)
			}
		}},
		"sysctl_override_and_add": {"extends: sandbox-density\nsysctl:\n  vm.swappiness: 80\n  net.core.somaxconn: '4096'\n", func(t *testing.T, p *Profile) {
			if p.Sysctl["vm.swappiness"] != "80" || p.Sysctl["net.core.somaxconn"] != "4096" || p.Sysctl["vm.watermark_scale_factor"] != "500" || len(p.Sysctl) != 9 {
				t.Errorf("sysctl = %v", p.Sysctl)
			}
		}},
		"sysctl_null_removes_key": {"extends: sandbox-density\nsysctl:\n  vm.watermark_scale_factor: null\n", func(t *testing.T, p *Profile) {
			if _, ok := p.Sysctl["vm.watermark_scale_factor"]; ok || len(p.Sysctl) != 7 {
				t.Errorf("sysctl = %v, want vm.watermark_scale_factor removed", p.Sysctl)
			}
		}},
		"sysctl_null_section_removes_all": {"extends: sandbox-density\nsysctl: null\n", func(t *testing.T, p *Profile) {
			if len(p.Sysctl) != 0 || p.Journald == nil {
				t.Errorf("sysctl = %v, journald %v; want no sysctls, journald kept", p.Sysctl, p.Journald)
			}
		}},
		"sysctl_whitespace_normalised": {"sysctl:\n  net.ipv4.tcp_rmem: \"4096\t87380   6291456\"\n", func(t *testing.T, p *Profile) {
			if p.Sysctl["net.ipv4.tcp_rmem"] != "4096 87380 6291456" {
				t.Errorf("tcp_rmem = %q", p.Sysctl["net.ipv4.tcp_rmem"])
			}
		}},
		"journald_settings_merge_by_key_in_order": {"extends: sandbox-density\njournald:\n  settings:\n    RateLimitBurst: 5000\n    SystemKeepFree: 1G\n    SystemMaxUse: null\n", func(t *testing.T, p *Profile) {
			want := []Entry{{"RateLimitIntervalSec", "30s"}, {"RateLimitBurst", "5000"}, {"SystemKeepFree", "1G"}}
			if !reflect.DeepEqual(p.Journald.Settings, want) {
				t.Errorf("settings = %v, want %v", p.Journald.Settings, want)
			}
			if p.Journald.Storage != "/var/lib/containerd/systemd-journal" || p.Journald.DropIn != journald.DefaultDropIn {
				t.Errorf("journald = %+v, want storage and drop-in inherited", p.Journald)
			}
		}},
		"journald_storage_empty_leaves_storage_alone": {"extends: sandbox-density\njournald: {storage: ''}\n", func(t *testing.T, p *Profile) {
			if p.Journald.Storage != "" || len(p.Journald.Settings) != 3 {
				t.Errorf("journald = %+v", p.Journald)
			}
		}},
		"journald_dropin_override": {"extends: sandbox-density\njournald: {dropIn: /run/systemd/journald.conf.d/50-x.conf}\n", func(t *testing.T, p *Profile) {
			if p.Journald.DropIn != "/run/systemd/journald.conf.d/50-x.conf" {
				t.Errorf("drop-in = %q", p.Journald.DropIn)
			}
		}},
		"journald_null_removes_section": {"extends: sandbox-density\njournald: null\n", func(t *testing.T, p *Profile) {
			if p.Journald != nil || p.ReservedCPUs == nil {
				t.Errorf("journald = %+v, reserved %+v", p.Journald, p.ReservedCPUs)
			}
		}},
		"journald_settings_null_drops_inherited": {"extends: sandbox-density\njournald:\n  settings: null\n", func(t *testing.T, p *Profile) {
			if len(p.Journald.Settings) != 0 || p.Journald.Storage == "" {
				t.Errorf("journald = %+v, want no settings, storage kept", p.Journald)
			}
		}},
		"reserved_cpus_only_keeps_the_rest": {"extends: sandbox-density\nreservedSystemCPUs:\n  cpus: 2-3\n", func(t *testing.T, p *Profile) {
			want := *base.ReservedCPUs
			want.CPUs = "2-3"
			if !reflect.DeepEqual(p.ReservedCPUs, &want) {
				t.Errorf("reserved = %+v, want %+v", p.ReservedCPUs, want)
			}
		}},
		"reserved_single_cpu_number": {"reservedSystemCPUs: {cpus: 3}\n", func(t *testing.T, p *Profile) {
			if p.ReservedCPUs.CPUs != "3" {
				t.Errorf("cpus = %q", p.ReservedCPUs.CPUs)
			}
		}},
		"reserved_list_canonical": {"reservedSystemCPUs: {cpus: '3,0,1,2'}\n", func(t *testing.T, p *Profile) {
			if p.ReservedCPUs.CPUs != "0-3" {
				t.Errorf("cpus = %q, want 0-3", p.ReservedCPUs.CPUs)
			}
		}},
		"reserved_lists_replace": {"extends: sandbox-density\nreservedSystemCPUs:\n  daemons: [kubelet]\n  systemCgroups: null\n", func(t *testing.T, p *Profile) {
			r := p.ReservedCPUs
			if !slices.Equal(r.Daemons, []string{"kubelet"}) || len(r.SystemCgroups) != 0 || r.SystemCgroups == nil ||
				!slices.Equal(r.WorkloadCgroups, DefaultWorkloadCgroups()) || r.CPUs != "0-1" {
				t.Errorf("reserved = %+v", r)
			}
		}},
		"reserved_no_kubelet_dropin": {"extends: sandbox-density\nreservedSystemCPUs: {kubeletDropIn: ''}\n", func(t *testing.T, p *Profile) {
			if p.ReservedCPUs.KubeletDropIn != "" {
				t.Errorf("kubelet drop-in = %q, want none", p.ReservedCPUs.KubeletDropIn)
			}
		}},
		"reserved_null_removes_section": {"extends: sandbox-density\nreservedSystemCPUs: null\n", func(t *testing.T, p *Profile) {
			if p.ReservedCPUs != nil {
				t.Errorf("reserved = %+v", p.ReservedCPUs)
			}
		}},
		"standalone_sections_get_defaults": {"name: mine\njournald: {settings: {SystemMaxUse: 1G}}\nreservedSystemCPUs: {}\n", func(t *testing.T, p *Profile) {
			wantR := &ReservedCPUs{CPUs: "0-1", KubeletDropIn: kubelet.DefaultDropIn, SystemCgroups: DefaultSystemCgroups(),
				WorkloadCgroups: DefaultWorkloadCgroups(), Daemons: DefaultDaemons()}
			if !reflect.DeepEqual(p.ReservedCPUs, wantR) || p.Journald.DropIn != journald.DefaultDropIn || p.Journald.Storage != "" ||
				p.Name != "mine" || len(p.Sysctl) != 0 {
				t.Errorf("got %+v %+v", p.ReservedCPUs, p.Journald)
			}
		}},
		"swap_added_with_defaults": {"extends: sandbox-density\nswap: {file: /var/lib/nodectl/swapfile, size: 8Gi}\n", func(t *testing.T, p *Profile) {
			want := &Swap{File: "/var/lib/nodectl/swapfile", Size: 8 << 30, Priority: -1, Enabled: true}
			if !reflect.DeepEqual(p.Swap, want) {
				t.Errorf("swap = %+v, want %+v", p.Swap, want)
			}
		}},
		"swap_device_priority_disabled": {"swap: {device: /dev/nvme1n1, priority: 10, enabled: false}\n", func(t *testing.T, p *Profile) {
			want := &Swap{Device: "/dev/nvme1n1", Priority: 10}
			if !reflect.DeepEqual(p.Swap, want) {
				t.Errorf("swap = %+v, want %+v", p.Swap, want)
			}
		}},
		"swap_size_in_bytes": {"swap: {file: /s, size: 1048576}\n", func(t *testing.T, p *Profile) {
			if p.Swap.Size != 1<<20 {
				t.Errorf("size = %d", p.Swap.Size)
			}
		}},
		"swap_disabled_file_needs_no_size": {"swap: {file: /s, enabled: false}\n", func(t *testing.T, p *Profile) {
			if p.Swap.Enabled || p.Swap.Size != 0 {
				t.Errorf("swap = %+v", p.Swap)
			}
		}},
		"description_overrides": {"extends: sandbox-density\ndescription: mine\n", func(t *testing.T, p *Profile) {
			if p.Description != "mine" {
				t.Errorf("description = %q", p.Description)
			}
		}},
		"yaml_aliases_followed": {"sysctl:\n  net.ipv4.neigh.default.gc_thresh1: &t1 1024\n  net.ipv6.neigh.default.gc_thresh1: *t1\n", func(t *testing.T, p *Profile) {
			if p.Sysctl["net.ipv6.neigh.default.gc_thresh1"] != "1024" {
				t.Errorf("sysctl = %v", p.Sysctl)
			}
		}},
	} {
		t.Run(name, func(t *testing.T) {
			p, err := resolve(t, tc.src, eight)
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, p)
		})
	}
}

func TestParseKeepsInputUnresolved(t *testing.T) {
	p, err := Parse([]byte("extends: sandbox-density\nsysctl: {vm.swappiness: 80}\n"), "/etc/nodectl/dense.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if p.Name != "dense" || p.Journald != nil || len(p.Sysctl) != 1 {
		t.Errorf("parsed = %+v, want name from the file and only what it says", p)
	}
	r, err := p.Resolve(Node{CPUs: 4})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Sysctl) != 1 || p.Journald != nil || r.Journald == nil {
		t.Errorf("Resolve changed its input or did not merge: input %+v", p)
	}
	// Resolving a resolved profile changes nothing.
	r2, err := r.Resolve(Node{CPUs: 4})
	if err != nil {
		t.Fatal(err)
	}
	if !sameProfile(r, r2) {
		t.Errorf("resolving twice: %+v != %+v", r2, r)
	}
}

const seedGKE = `linuxConfig:
  swapConfig:
    enabled: true
    dedicatedLocalSsdProfile:
      diskCount: 1
  sysctl:
    vm.watermark_scale_factor: 500
    vm.swappiness: 100
`

func TestGKESeedConfig(t *testing.T) {
	p, err := Parse([]byte(seedGKE), "/srv/pools/lssd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if p.Name != "gke:lssd.yaml" || p.Source != "GKE node system config /srv/pools/lssd.yaml" {
		t.Errorf("name %q, source %q", p.Name, p.Source)
	}
	if want := map[string]string{"vm.watermark_scale_factor": "500", "vm.swappiness": "100"}; !reflect.DeepEqual(p.Sysctl, want) {
		t.Errorf("sysctl = %v, want %v", p.Sysctl, want)
	}
	if want := (&Swap{Enabled: true, Priority: -1}); !reflect.DeepEqual(p.Swap, want) {
		t.Errorf("swap = %+v, want %+v (a check that some swap is on)", p.Swap, want)
	}
	if want := []string{"linuxConfig.swapConfig.dedicatedLocalSsdProfile.diskCount"}; !slices.Equal(p.Unchecked, want) {
		t.Errorf("unchecked = %v, want %v", p.Unchecked, want)
	}
	if p.Journald != nil || p.ReservedCPUs != nil {
		t.Errorf("a GKE config must leave journald and CPUs alone: %+v", p)
	}
	r, err := p.Resolve(Node{CPUs: 2, SysctlExists: func(string) bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(r.Unchecked, p.Unchecked) || r.Source != p.Source {
		t.Errorf("resolved = %+v", r)
	}
}

func TestGKE(t *testing.T) {
	for name, tc := range map[string]struct {
		src       string
		wantErr   []string
		unchecked []string
		swap      *Swap
	}{
		"kubelet_keys_accepted_unchecked": {src: "kubeletConfig:\n  cpuManagerPolicy: static\n  podPidsLimit: 4096\n  topologyManager: {policy: best-effort, scope: pod}\n  evictionSoft: {memoryAvailable: 100Mi}\n",
			unchecked: []string{"kubeletConfig.cpuManagerPolicy", "kubeletConfig.podPidsLimit", "kubeletConfig.topologyManager.policy",
				"kubeletConfig.topologyManager.scope", "kubeletConfig.evictionSoft.memoryAvailable"}},
		"linux_keys_accepted_unchecked": {src: "linuxConfig:\n  cgroupMode: CGROUP_MODE_V2\n  hugepageConfig: {hugepage_size2m: 1024}\n  transparentHugepageEnabled: TRANSPARENT_HUGEPAGE_ENABLED_MADVISE\n  transparentHugepageDefrag: TRANSPARENT_HUGEPAGE_DEFRAG_DEFER\n",
			unchecked: []string{"linuxConfig.cgroupMode", "linuxConfig.hugepageConfig.hugepage_size2m",
				"linuxConfig.transparentHugepageEnabled", "linuxConfig.transparentHugepageDefrag"}},
		"swap_disabled_checks_no_swap": {src: "linuxConfig:\n  swapConfig: {enabled: false}\n", swap: &Swap{Priority: -1}},
		"swap_boot_disk_size_unchecked": {src: "linuxConfig:\n  swapConfig:\n    enabled: true\n    bootDiskProfile: {swapSizeGib: 8}\n    encryptionConfig: {disabled: true}\n",
			swap: &Swap{Priority: -1, Enabled: true}, unchecked: []string{"linuxConfig.swapConfig.bootDiskProfile.swapSizeGib", "linuxConfig.swapConfig.encryptionConfig.disabled"}},
		"swap_without_enabled_not_checked": {src: "linuxConfig:\n  swapConfig:\n    ephemeralLocalSsdProfile: {swapSizePercent: 10}\n",
			unchecked: []string{"linuxConfig.swapConfig.ephemeralLocalSsdProfile.swapSizePercent", "linuxConfig.swapConfig (no enabled key: swap not checked)"}},
		"unknown_linux_key":   {src: "linuxConfig:\n  sysctls: {vm.swappiness: 1}\n", wantErr: []string{"test.yaml:2: linuxConfig.sysctls: unknown key: allowed here are", "sysctl", "swapConfig"}},
		"unknown_kubelet_key": {src: "kubeletConfig:\n  reservedSystemCPUs: 0-1\n", wantErr: []string{"kubeletConfig.reservedSystemCPUs: unknown key", "cpuManagerPolicy"}},
		"unknown_top_key":     {src: "linuxConfig: {}\nsysctl: {vm.swappiness: 1}\n", wantErr: []string{"test.yaml:2: sysctl: unknown key: allowed here are kubeletConfig, linuxConfig"}},
		"unknown_nested_key":  {src: "kubeletConfig:\n  topologyManager: {policy: none, scoped: pod}\n", wantErr: []string{"kubeletConfig.topologyManager.scoped: unknown key: allowed here are policy, scope"}},
		"unknown_swap_key":    {src: "linuxConfig:\n  swapConfig: {enabled: true, sizeGib: 8}\n", wantErr: []string{"linuxConfig.swapConfig.sizeGib: unknown key", "bootDiskProfile"}},
		"swap_enabled_string": {src: "linuxConfig:\n  swapConfig: {enabled: 'on'}\n", wantErr: []string{"linuxConfig.swapConfig.enabled: want true or false"}},
		"swap_disk_count_bad": {src: "linuxConfig:\n  swapConfig: {enabled: true, dedicatedLocalSsdProfile: {diskCount: 0}}\n", wantErr: []string{"diskCount: want a whole number of at least 1"}},
		"swap_two_profiles":   {src: "linuxConfig:\n  swapConfig:\n    enabled: true\n    bootDiskProfile: {swapSizeGib: 8}\n    dedicatedLocalSsdProfile: {diskCount: 1}\n", wantErr: []string{"bootDiskProfile and dedicatedLocalSsdProfile are exclusive"}},
		"sysctl_bool":         {src: "linuxConfig:\n  sysctl: {vm.swappiness: true}\n", wantErr: []string{"test.yaml:2: linuxConfig.sysctl.vm.swappiness: want a number or a string"}},
		"swappiness_300":      {src: "linuxConfig:\n  sysctl:\n    vm.swappiness: '300'\n", wantErr: []string{"test.yaml:3: linuxConfig.sysctl.vm.swappiness: 300 is out of range: allowed are integers from 0 to 200"}},
		"gc_thresh_order":     {src: "linuxConfig:\n  sysctl:\n    net.ipv4.neigh.default.gc_thresh1: 9000\n    net.ipv4.neigh.default.gc_thresh3: 100\n", wantErr: []string{"linuxConfig.sysctl.net.ipv4.neigh.default.gc_thresh1: gc_thresh1 = 9000 is above gc_thresh3 = 100"}},
	} {
		t.Run(name, func(t *testing.T) {
			p, err := resolve(t, tc.src, Node{CPUs: 2})
			if tc.wantErr != nil {
				wantErr(t, err, tc.wantErr...)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(p.Name, "gke:") {
				t.Errorf("name = %q", p.Name)
			}
			if !slices.Equal(p.Unchecked, tc.unchecked) {
				t.Errorf("unchecked = %q\nwant        %q", p.Unchecked, tc.unchecked)
			}
			if !reflect.DeepEqual(p.Swap, tc.swap) {
				t.Errorf("swap = %+v, want %+v", p.Swap, tc.swap)
			}
		})
	}
}

// sameProfile compares what a profile sets, not where it came from.
func sameProfile(a, b *Profile) bool {
	return a.Name == b.Name && a.Description == b.Description && reflect.DeepEqual(a.Sysctl, b.Sysctl) &&
		reflect.DeepEqual(a.Journald, b.Journald) && reflect.DeepEqual(a.ReservedCPUs, b.ReservedCPUs) &&
		reflect.DeepEqual(a.Swap, b.Swap)
}

func TestYAMLRoundTrip(t *testing.T) {
	for name, src := range map[string]string{
		"builtin":               "extends: sandbox-density\n",
		"user_removes":          "extends: sandbox-density\nsysctl: {vm.swappiness: null, net.ipv4.tcp_rmem: '4096 87380 6291456'}\njournald: {storage: '', settings: {ForwardToSyslog: 'no', SystemMaxUse: null}}\nreservedSystemCPUs: {kubeletDropIn: '', daemons: []}\nswap: {file: /var/lib/nodectl/swapfile, size: 8Gi, priority: 10}\n",
		"user_sections_removed": "extends: sandbox-density\nsysctl: null\njournald: {settings: null, storage: /mnt/ssd/journal}\nreservedSystemCPUs: null\n",
		"user_journald_removed": "extends: sandbox-density\njournald: null\nreservedSystemCPUs: {cpus: 1-2}\n",
		"device_off":            "swap: {device: /dev/nvme1n1, enabled: false}\n",
		"gke":                   seedGKE,
	} {
		t.Run(name, func(t *testing.T) {
			r, err := resolve(t, src, Node{CPUs: 8})
			if err != nil {
				t.Fatal(err)
			}
			out, err := r.YAML()
			if err != nil {
				t.Fatal(err)
			}
			back, err := Parse(out, "printed.yaml")
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			r2, err := back.Resolve(Node{CPUs: 8})
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			if !sameProfile(r, r2) {
				t.Errorf("round trip changed the profile:\n%+v\n%+v\n%s", r, r2, out)
			}
			if !strings.HasPrefix(string(out), "# resolved from ") || strings.Contains(string(out), "\nextends:") {
				t.Errorf("a resolved profile prints whole, with its origin:\n%s", out)
			}

			// Unresolved, it prints what it sets and removes, and resolves the same.
			p, err := Parse([]byte(src), "test.yaml")
			if err != nil {
				t.Fatal(err)
			}
			if out, err = p.YAML(); err != nil {
				t.Fatal(err)
			}
			if back, err = Parse(out, "printed.yaml"); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			if r2, err = back.Resolve(Node{CPUs: 8}); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			if !sameProfile(r, r2) {
				t.Errorf("unresolved round trip changed the profile:\n%+v\n%+v\n%s", r, r2, out)
			}
		})
	}
}

// TestDocsExamples keeps docs/tuning-profiles.md's examples true: the built-in as YAML
// prints it, the extend example and the GKE config as they resolve and print.
func TestDocsExamples(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "docs", "tuning-profiles.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	example := func(name string) string {
		t.Helper()
		start := "<!-- example: " + name + " -->\n```yaml\n"
		i := strings.Index(doc, start)
		if i < 0 {
			t.Fatalf("docs/tuning-profiles.md lacks the example %q", name)
		}
		ex := doc[i+len(start):]
		return ex[:strings.Index(ex, "```\n")]
	}
	printed := func(p *Profile) string {
		t.Helper()
		out, err := p.YAML()
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	}

	b, _ := Builtin("sandbox-density")
	if out := printed(b); !strings.Contains(doc, "```yaml\n"+out+"```\n") {
		t.Errorf("docs/tuning-profiles.md does not show the built-in as printed:\n%s", out)
	}
	for _, ex := range []struct{ in, file, out string }{
		{"extend", "my-density.yaml", "extend resolved on 8 CPUs"},
		{"gke", "pool.yaml", "gke printed"},
	} {
		p, err := Parse([]byte(example(ex.in)), ex.file)
		if err != nil {
			t.Fatalf("example %q: %v", ex.in, err)
		}
		r, err := p.Resolve(Node{CPUs: 8})
		if err != nil {
			t.Fatalf("example %q: %v", ex.in, err)
		}
		if out, want := printed(r), example(ex.out); out != want {
			t.Errorf("example %q prints\n%s\nthe docs show\n%s", ex.in, out, want)
		}
	}
	if example("gke") != seedGKE {
		t.Errorf("the docs' GKE example is not the seed's config")
	}
}

// TestBuiltinOnThisMachine checks the built-in against this machine's real sysctls.
func TestBuiltinOnThisMachine(t *testing.T) {
	if _, err := os.Stat("/proc/sys/net/ipv6"); err != nil {
		t.Skip("no IPv6 here: the built-in's net.ipv6 sysctls are refused, as documented")
	}
	b, _ := Builtin("sandbox-density")
	online, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		t.Fatal(err)
	}
	n := Node{CPUs: runtime.NumCPU(), Online: strings.TrimSpace(string(online)), SysctlExists: func(k string) bool {
		_, err := os.Stat("/proc/sys/" + SysctlPath(k))
		return err == nil
	}}
	if _, err := b.Resolve(n); err != nil && n.CPUs > 1 {
		t.Fatal(err)
	}
	n.SysctlExists = func(k string) bool { return !strings.HasPrefix(k, "net.ipv6.") }
	_, err = b.Resolve(n)
	wantErr(t, err, "built-in sandbox-density: sysctl.net.ipv6.neigh.default.gc_thresh1: the node has no such sysctl")
}

func TestLoad(t *testing.T) {
	p, err := Load("sandbox-density")
	if err != nil || p.Source != SourceBuiltin {
		t.Fatalf("Load(built-in) = %+v, %v", p, err)
	}
	f := filepath.Join(t.TempDir(), "pool.yaml")
	if err := os.WriteFile(f, []byte(seedGKE), 0o644); err != nil {
		t.Fatal(err)
	}
	if p, err = Load(f); err != nil || p.Name != "gke:pool.yaml" {
		t.Fatalf("Load(file) = %+v, %v", p, err)
	}
	_, err = Load(filepath.Join(t.TempDir(), "sandbox-dense"))
	wantErr(t, err, "neither a built-in (sandbox-density) nor a file")
}
