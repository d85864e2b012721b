package test

import (
	"os"
	"path/filepath"
	"testing"
)

// TestKubernetesManifests: deploy/kubernetes, parsed strictly, keeps every
// rule of an installation (checkInstallation: a configuration walrelay
// loads, probes on the admin listener, the secrets' files, resources, the
// stop within the grace period, the budget, the Service and the
// NetworkPolicy), with two replicas of one relay: one streams, one waits.
func TestKubernetesManifests(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("../kubernetes/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	var o objects
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := o.add(f, string(b)); err != nil {
			t.Fatal(err)
		}
	}
	relays, err := checkInstallation(&o, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if len(relays) != 1 || relays[0].d.Spec.Replicas == nil || *relays[0].d.Spec.Replicas != 2 {
		t.Fatalf("want one Deployment of two replicas (one streams, one waits)")
	}
}
