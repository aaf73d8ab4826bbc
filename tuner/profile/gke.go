package profile

import (
	"path/filepath"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// gkeSchema is the keys of a GKE node system config
// (https://cloud.google.com/kubernetes-engine/docs/how-to/node-system-config, gcloud's
// LoadSystemConfigFromYAML and the container v1 API): a key mapping to nil is a value nodectl
// accepts without looking inside; a non-nil one is a mapping with those keys.
type gkeSchema map[string]gkeSchema

var evictionSignals = gkeSchema{"memoryAvailable": nil, "nodefsAvailable": nil, "nodefsInodesFree": nil,
	"imagefsAvailable": nil, "imagefsInodesFree": nil, "pidAvailable": nil}

var gkeSwapSize = gkeSchema{"swapSizeGib": nil, "swapSizePercent": nil}

var gkeKeys = gkeSchema{
	"kubeletConfig": {
		"cpuManagerPolicy": nil, "cpuCFSQuota": nil, "cpuCFSQuotaPeriod": nil, "podPidsLimit": nil,
		"insecureKubeletReadonlyPortEnabled": nil, "allowedUnsafeSysctls": nil,
		"containerLogMaxSize": nil, "containerLogMaxFiles": nil,
		"imageGcHighThresholdPercent": nil, "imageGcLowThresholdPercent": nil,
		"imageMinimumGcAge": nil, "imageMaximumGcAge": nil,
		"topologyManager":      {"policy": nil, "scope": nil},
		"memoryManager":        {"policy": nil},
		"singleProcessOomKill": nil, "nodeSwapSizeGib": nil, "maxParallelImagePulls": nil,
		"evictionSoft": evictionSignals, "evictionSoftGracePeriod": evictionSignals,
		"evictionMinimumReclaim": evictionSignals, "evictionMaxPodGracePeriodSeconds": nil,
		"crashLoopBackOff":           {"maxContainerRestartPeriod": nil},
		"shutdownGracePeriodSeconds": nil, "shutdownGracePeriodCriticalPodsSeconds": nil,
	},
	"linuxConfig": {
		"sysctl":     nil, // read by gkeSysctl
		"cgroupMode": nil, "transparentHugepageEnabled": nil, "transparentHugepageDefrag": nil,
		"hugepageConfig": {"hugepage_size2m": nil, "hugepage_size1g": nil},
		"swapConfig": { // read by gkeSwap
			"enabled":                  nil,
			"encryptionConfig":         {"disabled": nil},
			"bootDiskProfile":          gkeSwapSize,
			"ephemeralLocalSsdProfile": gkeSwapSize,
			"dedicatedLocalSsdProfile": {"diskCount": nil},
		},
		"kernelOverrides": {
			"kernelCommandlineOverrides": {"specRstackOverflow": nil, "initOnAlloc": nil},
			"lruGen":                     {"enabled": nil, "minTtlMs": nil},
		},
		"additionalEtcHosts": nil, "additionalEtcSystemdResolvedConf": nil, "additionalEtcResolvConf": nil,
		"timeZone":                nil,
		"customNodeInit":          {"initScript": {"gcsUri": nil, "gcsGeneration": nil, "args": nil, "gcpSecretManagerSecretUri": nil}},
		"nodeKernelModuleLoading": {"policy": nil},
		"accurateTimeConfig":      {"enablePtpKvmTimeSync": nil},
		"nodeVfioConfig":          {"dmaEntryLimit": nil},
		"diskIoScheduler":         nil,
	},
}

func (s gkeSchema) keys() []string {
	keys := make([]string, 0, len(s))
	for k := range s {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// The GKE keys nodectl reads.
const (
	gkeSysctlPath = "linuxConfig.sysctl"
	gkeSwapPath   = "linuxConfig.swapConfig"
)

// gke parses a GKE node system config: linuxConfig.sysctl becomes Sysctl and
// linuxConfig.swapConfig.enabled a swap check; every other key GKE defines is accepted and
// listed in Unchecked.
func (ps *parser) gke(root *yaml.Node) (*Profile, error) {
	p := &Profile{
		Name:   "gke:" + filepath.Base(ps.source),
		Source: "GKE node system config " + ps.source,
		given:  map[string]bool{}, unset: map[string]bool{}, lines: map[string]int{},
		gke: true, file: ps.source,
	}
	ps.p = p
	ps.gkeWalk(root, "", gkeKeys)
	if len(ps.probs) > 0 {
		return nil, ps.err()
	}
	return p, nil
}

func (ps *parser) gkeWalk(n *yaml.Node, path string, schema gkeSchema) {
	ps.mapping(n, path, schema.keys(), func(key, path string, k, v *yaml.Node) {
		switch {
		case path == gkeSysctlPath:
			ps.gkeSysctl(v, path)
		case path == gkeSwapPath:
			ps.gkeSwap(v, path)
		case isNull(v):
		case schema[key] == nil:
			ps.p.Unchecked = append(ps.p.Unchecked, path)
		default:
			ps.gkeWalk(v, path, schema[key])
		}
	})
}

func (ps *parser) gkeSysctl(n *yaml.Node, path string) {
	if isNull(n) {
		return
	}
	ps.p.Sysctl = map[string]string{}
	ps.mapping(n, path, nil, func(key, kpath string, k, v *yaml.Node) {
		if isNull(v) {
			ps.problem(v, kpath, "want a number or a string, got null")
			return
		}
		// Stored under nodectl's path so Resolve's checks and their line numbers apply.
		ps.note("sysctl."+key, k, v)
		if val, ok := ps.sysctlValue(v, kpath); ok {
			ps.p.Sysctl[key] = val
		}
	})
}

// gkeSwap reads swapConfig. GKE provisions the swap itself, on a device nodectl cannot know,
// so only "swap is on" (enabled: true) or "no swap is on" (enabled: false) is checked; the
// profile, sizes and encryption are listed as unchecked. Without enabled nothing is checked.
func (ps *parser) gkeSwap(n *yaml.Node, path string) {
	if isNull(n) {
		return
	}
	var profiles []string
	ps.mapping(n, path, gkeKeys["linuxConfig"]["swapConfig"].keys(), func(key, kpath string, k, v *yaml.Node) {
		if isNull(v) {
			return
		}
		if key == "enabled" {
			if v.Tag != "!!bool" {
				ps.problem(v, kpath, "want true or false, got %s", describe(v))
				return
			}
			ps.note("swap.enabled", k, v)
			ps.p.Swap = &Swap{Priority: -1}
			_ = v.Decode(&ps.p.Swap.Enabled) // a !!bool always decodes
			return
		}
		if strings.HasSuffix(key, "Profile") {
			profiles = append(profiles, key)
		}
		ps.mapping(v, kpath, gkeKeys["linuxConfig"]["swapConfig"][key].keys(), func(_, lpath string, _, lv *yaml.Node) {
			want, tag := "a whole number of at least 1", "!!int"
			if key == "encryptionConfig" {
				want, tag = "true or false", "!!bool"
			}
			ok := lv.Tag == tag
			if ok && tag == "!!int" {
				var i int64
				ok = lv.Decode(&i) == nil && i >= 1
			}
			if !ok {
				ps.problem(lv, lpath, "want %s, got %s", want, describe(lv))
				return
			}
			ps.p.Unchecked = append(ps.p.Unchecked, lpath)
		})
	})
	if len(profiles) > 1 {
		ps.problem(n, path, "%s are exclusive: GKE takes one swap profile", strings.Join(profiles, " and "))
	}
	if ps.p.Swap == nil {
		ps.p.Unchecked = append(ps.p.Unchecked, path+" (no enabled key: swap not checked)")
	}
}
