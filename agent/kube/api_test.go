package kube

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
)

// TestRESTAPIWatchDecodesWithItsScheme checks the requests the production API makes and that
// its small scheme decodes a watch's events, a Status in an Error event among them (the 410
// that makes WatchLease rebuild from a Get: a real API server rarely sends one on demand).
func TestRESTAPIWatchDecodesWithItsScheme(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		switch {
		case r.URL.Path == "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases" && q.Get("watch") == "true":
			if q.Get("fieldSelector") != "metadata.name=node1" || q.Get("resourceVersion") != "7" || q.Get("timeoutSeconds") != "60" {
				t.Errorf("lease watch query %s", r.URL.RawQuery)
			}
			if ua := r.Header.Get("User-Agent"); ua != userAgent {
				t.Errorf("user agent %q", ua)
			}
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintln(w, `{"type":"MODIFIED","object":{"kind":"Lease","apiVersion":"coordination.k8s.io/v1","metadata":{"name":"node1","namespace":"kube-node-lease","resourceVersion":"8"},"spec":{"holderIdentity":"node1","renewTime":"2026-12-01T10:00:10.000000Z"}}}`)
			fmt.Fprintln(w, `{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","status":"Failure","code":410,"reason":"Expired","message":"too old resource version: 7 (9)"}}`)
		case r.URL.Path == "/api/v1/pods" && q.Get("watch") == "":
			if q.Get("fieldSelector") != "spec.nodeName=node1" {
				t.Errorf("pod list query %s", r.URL.RawQuery)
			}
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintln(w, `{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"5"},"items":[{"metadata":{"name":"web","namespace":"shop","uid":"u1"},"spec":{"nodeName":"node1","containers":[{"name":"c"}]}}]}`)
		default:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","code":404,"reason":"NotFound","message":"%s not found"}`+"\n", r.URL.Path)
		}
	}))
	defer srv.Close()
	api, err := newRESTAPI(&rest.Config{Host: srv.URL, UserAgent: userAgent})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	pods, err := api.ListPods(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=node1"})
	if err != nil || len(pods.Items) != 1 || pods.Items[0].Name != "web" || pods.ResourceVersion != "5" {
		t.Fatalf("ListPods = %+v, %v", pods, err)
	}
	if _, err := api.GetNode(ctx, "node1"); !apierrors.IsNotFound(err) {
		t.Errorf("GetNode of a missing node: %v, want NotFound", err)
	}

	timeout := int64(60)
	w, err := api.WatchLeases(ctx, NodeLeaseNamespace, metav1.ListOptions{FieldSelector: "metadata.name=node1", ResourceVersion: "7", TimeoutSeconds: &timeout})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var evs []watch.Event
	for ev := range w.ResultChan() {
		evs = append(evs, ev)
	}
	if len(evs) != 2 {
		t.Fatalf("%d events: %+v", len(evs), evs)
	}
	if l, ok := evs[0].Object.(*coordinationv1.Lease); evs[0].Type != watch.Modified || !ok || l.Spec.RenewTime == nil || *l.Spec.HolderIdentity != "node1" {
		t.Errorf("first event %s %+v", evs[0].Type, evs[0].Object)
	}
	if err := apierrors.FromObject(evs[1].Object); evs[1].Type != watch.Error || !apierrors.IsResourceExpired(err) {
		t.Errorf("second event %s %v (%T), want a 410 Expired", evs[1].Type, err, evs[1].Object)
	}
}
