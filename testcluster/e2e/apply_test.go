package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/kustomize/api/krusty"
	kusttypes "sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// writeOverlay writes a kustomization in a temporary directory that builds on base with the
// given kustomization body (images, patches...), and returns its directory.
func writeOverlay(t *testing.T, base, body string) string {
	t.Helper()
	dir := t.TempDir()
	abs, err := filepath.Abs(base)
	if err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(dir, abs) // kustomize takes no absolute root
	if err != nil {
		t.Fatal(err)
	}
	k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - " + rel + "\n" + body
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// apply builds the kustomization in dir as `kustomize build` does and applies every object
// (server-side apply, as `kubectl apply --server-side`), returning them.
func apply(ctx context.Context, t *testing.T, cfg *rest.Config, dir string) []*unstructured.Unstructured {
	t.Helper()
	opts := krusty.MakeDefaultOptions()
	opts.LoadRestrictions = kusttypes.LoadRestrictionsNone // the overlay names the base by its path
	m, err := krusty.MakeKustomizer(opts).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var out []*unstructured.Unstructured
	for _, r := range m.Resources() {
		b, err := r.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{}
		if err := json.Unmarshal(b, &u.Object); err != nil {
			t.Fatal(err)
		}
		gvk := u.GroupVersionKind()
		mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatalf("mapping %s: %v", gvk, err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(mapping.Resource)
		if u.GetNamespace() != "" {
			ri = dyn.Resource(mapping.Resource).Namespace(u.GetNamespace())
		}
		if _, err := ri.Patch(ctx, u.GetName(), types.ApplyPatchType, b, metav1.PatchOptions{FieldManager: "nodectl-e2e", Force: ptrTrue()}); err != nil {
			t.Fatalf("applying %s %s/%s: %v", gvk.Kind, u.GetNamespace(), u.GetName(), err)
		}
		out = append(out, u)
	}
	return out
}

func ptrTrue() *bool { b := true; return &b }

// describe names an object for messages.
func describe(u *unstructured.Unstructured) string {
	return fmt.Sprintf("%s %s/%s", u.GetKind(), u.GetNamespace(), u.GetName())
}
