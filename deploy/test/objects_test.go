package test

import (
	"fmt"
	"regexp"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// objects is one installation of walrelay: the documents of the plain
// manifests, or of the chart rendered with one set of values, each parsed
// strictly into its API type.
type objects struct {
	deps     []*appsv1.Deployment
	cms      map[string]*corev1.ConfigMap
	pdbs     []*policyv1.PodDisruptionBudget
	svcs     []*corev1.Service
	nps      []*networkingv1.NetworkPolicy
	monitors []*monitor
}

// monitor is a Prometheus Operator PodMonitor or ServiceMonitor, with the
// fields the chart writes (the operator's types would bring its module
// for four fields; a field not here fails the strict parse).
type monitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector            metav1.LabelSelector `json:"selector"`
		PodMetricsEndpoints []monitorEndpoint    `json:"podMetricsEndpoints,omitempty"`
		Endpoints           []monitorEndpoint    `json:"endpoints,omitempty"`
	} `json:"spec"`
}

type monitorEndpoint struct {
	Port     string `json:"port"`
	Path     string `json:"path"`
	Interval string `json:"interval,omitempty"`
}

// documentSeparator splits a YAML stream as Helm's SplitManifests does.
var documentSeparator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// add parses every document of text (from source, for messages) into its
// API type, strictly: a field the type lacks (a typo, a wrong level)
// fails, and so does a kind this test does not know. A document of
// comments alone is skipped.
func (o *objects) add(source, text string) error {
	if o.cms == nil {
		o.cms = map[string]*corev1.ConfigMap{}
	}
	for i, doc := range documentSeparator.Split(text, -1) {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			return fmt.Errorf("%s document %d: %w", source, i+1, err)
		}
		if tm.Kind == "" && tm.APIVersion == "" {
			if strings.TrimSpace(uncommented(doc)) != "" {
				return fmt.Errorf("%s document %d has no kind", source, i+1)
			}
			continue
		}
		var obj any
		switch tm.APIVersion + " " + tm.Kind {
		case "apps/v1 Deployment":
			d := &appsv1.Deployment{}
			o.deps, obj = append(o.deps, d), d
		case "v1 ConfigMap":
			obj = &corev1.ConfigMap{}
		case "policy/v1 PodDisruptionBudget":
			p := &policyv1.PodDisruptionBudget{}
			o.pdbs, obj = append(o.pdbs, p), p
		case "v1 Service":
			s := &corev1.Service{}
			o.svcs, obj = append(o.svcs, s), s
		case "networking.k8s.io/v1 NetworkPolicy":
			n := &networkingv1.NetworkPolicy{}
			o.nps, obj = append(o.nps, n), n
		case "monitoring.coreos.com/v1 PodMonitor", "monitoring.coreos.com/v1 ServiceMonitor":
			m := &monitor{}
			o.monitors, obj = append(o.monitors, m), m
		default:
			return fmt.Errorf("%s document %d: kind %q %q is not one this test knows", source, i+1, tm.APIVersion, tm.Kind)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			return fmt.Errorf("%s document %d (%s): %w", source, i+1, tm.Kind, err)
		}
		if c, ok := obj.(*corev1.ConfigMap); ok {
			if _, dup := o.cms[c.Name]; dup {
				return fmt.Errorf("%s: ConfigMap %s twice", source, c.Name)
			}
			o.cms[c.Name] = c
		}
	}
	return nil
}

// uncommented is text without its comment lines.
func uncommented(text string) string {
	var b strings.Builder
	for line := range strings.Lines(text) {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line)
		}
	}
	return b.String()
}
