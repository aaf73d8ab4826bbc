// Package quantity reads and writes CPU and memory amounts in Kubernetes notation (250m, 1.5,
// 512Mi), as flags, profiles and run metadata give them: one parser for every command.
package quantity

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/resource"
)

// ParseCPU parses a CPU LIMIT in Kubernetes notation ("250m", "1", "1.5") into millicores.
func ParseCPU(v string) (int64, error) {
	q, err := resource.ParseQuantity(v)
	if err != nil {
		return 0, fmt.Errorf("bad CPU limit %q: want Kubernetes notation such as 250m or 1", v)
	}
	m := q.MilliValue()
	if m < 1 {
		return 0, fmt.Errorf("bad CPU limit %q: must be at least 1m", v)
	}
	if m > 1024*1000 {
		return 0, fmt.Errorf("bad CPU limit %q: more than 1024 CPUs", v)
	}
	return m, nil
}

// ParseSize parses a SIZE in Kubernetes notation ("512Mi", "2Gi", "100M") into bytes.
func ParseSize(v string) (int64, error) {
	q, err := resource.ParseQuantity(v)
	if err != nil {
		return 0, fmt.Errorf("bad size %q: want Kubernetes notation such as 512Mi or 2Gi", v)
	}
	b, ok := q.AsInt64()
	if !ok || b < 1<<20 {
		return 0, fmt.Errorf("bad size %q: must be a whole number of bytes, at least 1Mi", v)
	}
	return b, nil
}

// FormatCPU renders millicores back in Kubernetes notation ("" for unlimited).
func FormatCPU(m int64) string {
	if m == 0 {
		return ""
	}
	return resource.NewMilliQuantity(m, resource.DecimalSI).String()
}

// FormatSize renders bytes in Kubernetes binary notation ("" for unlimited).
func FormatSize(b int64) string {
	if b == 0 {
		return ""
	}
	return resource.NewQuantity(b, resource.BinarySI).String()
}
