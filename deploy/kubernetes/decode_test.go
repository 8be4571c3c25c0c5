package kubernetes

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// The Prometheus Operator's objects are custom resources, not in k8s.io/api. These types hold
// the fields the chart writes, so that strict decoding rejects any other field: see
// https://prometheus-operator.dev/docs/api-reference/api/ (ServiceMonitorSpec, PodMonitorSpec).
type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector  metav1.LabelSelector `json:"selector"`
		Endpoints []monitorEndpoint    `json:"endpoints"`
	} `json:"spec"`
}

type podMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector            metav1.LabelSelector `json:"selector"`
		PodMetricsEndpoints []monitorEndpoint    `json:"podMetricsEndpoints"`
	} `json:"spec"`
}

type monitorEndpoint struct {
	Port     string `json:"port"`
	Path     string `json:"path"`
	Interval string `json:"interval"`
}

// newObject returns an empty object of the type for apiVersion and kind; an unknown pair is
// an error, so the chart cannot grow an object the tests do not decode.
func newObject(apiVersion, kind string) (any, error) {
	switch apiVersion + " " + kind {
	case "v1 ConfigMap":
		return &corev1.ConfigMap{}, nil
	case "v1 Secret":
		return &corev1.Secret{}, nil
	case "v1 Service":
		return &corev1.Service{}, nil
	case "apps/v1 Deployment":
		return &appsv1.Deployment{}, nil
	case "policy/v1 PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}, nil
	case "autoscaling/v2 HorizontalPodAutoscaler":
		return &autoscalingv2.HorizontalPodAutoscaler{}, nil
	case "monitoring.coreos.com/v1 ServiceMonitor":
		return &serviceMonitor{}, nil
	case "monitoring.coreos.com/v1 PodMonitor":
		return &podMonitor{}, nil
	}
	return nil, fmt.Errorf("unknown kind %q of apiVersion %q", kind, apiVersion)
}

// objects is a rendered set of manifests, decoded, by kind and name.
type objects struct {
	list []any
}

func (o objects) kinds() []string {
	var kinds []string
	for _, obj := range o.list {
		kinds = append(kinds, reflect.TypeOf(obj).Elem().Name())
	}
	return kinds
}

func only[T any](t *testing.T, o objects) *T {
	t.Helper()
	var found []*T
	for _, obj := range o.list {
		if typed, ok := obj.(*T); ok {
			found = append(found, typed)
		}
	}
	if len(found) != 1 {
		var zero T
		t.Fatalf("want exactly one %T, found %d (kinds: %v)", zero, len(found), o.kinds())
	}
	return found[0]
}

func count[T any](o objects) int {
	n := 0
	for _, obj := range o.list {
		if _, ok := obj.(*T); ok {
			n++
		}
	}
	return n
}

var documentSeparator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// decodeAll splits a multi-document YAML stream and decodes every document strictly.
func decodeAll(t *testing.T, stream string) objects {
	t.Helper()
	var o objects
	for i, doc := range documentSeparator.Split(stream, -1) {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue // helm writes a separator before the first document and comments between
		}
		obj, err := decodeStrict([]byte(doc))
		if err != nil {
			t.Fatalf("document %d: %v\n%s", i, err, doc)
		}
		o.list = append(o.list, obj)
	}
	if len(o.list) == 0 {
		t.Fatal("no object in the stream")
	}
	return o
}

func stripComments(doc string) string {
	var kept []string
	for _, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			kept = append(kept, line)
		}
	}
	return strings.Join(kept, "\n")
}

// decodeStrict turns one YAML document into JSON (duplicate keys are an error), picks the
// type by apiVersion and kind, and decodes with unknown fields refused. encoding/json matches
// field names without regard to case, so the object is encoded again and every key of the
// document must come back spelt the same (or be a zero value, which omitempty drops).
func decodeStrict(doc []byte) (any, error) {
	jsonDoc, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return nil, fmt.Errorf("YAML: %w", err)
	}
	var meta metav1.TypeMeta
	if err := json.Unmarshal(jsonDoc, &meta); err != nil {
		return nil, fmt.Errorf("apiVersion and kind: %w", err)
	}
	obj, err := newObject(meta.APIVersion, meta.Kind)
	if err != nil {
		return nil, err
	}
	decoder := json.NewDecoder(bytes.NewReader(jsonDoc))
	decoder.DisallowUnknownFields()
	if err := decoder.Decode(obj); err != nil {
		return nil, fmt.Errorf("%s: %w", meta.Kind, err)
	}
	if decoder.More() {
		return nil, fmt.Errorf("%s: more than one value in the document", meta.Kind)
	}
	again, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	var original, reencoded any
	if err := json.Unmarshal(jsonDoc, &original); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(again, &reencoded); err != nil {
		return nil, err
	}
	if err := sameKeys(meta.Kind, original, reencoded); err != nil {
		return nil, err
	}
	return obj, nil
}

// sameKeys reports a key of original that is not in decoded with the same spelling, unless
// its value is a zero value.
func sameKeys(path string, original, decoded any) error {
	switch o := original.(type) {
	case map[string]any:
		d, _ := decoded.(map[string]any)
		for key, value := range o {
			dv, ok := d[key]
			if !ok {
				if isZero(value) {
					continue
				}
				return fmt.Errorf("%s.%s: not a field of the type (misspelt or wrong case?)", path, key)
			}
			if err := sameKeys(path+"."+key, value, dv); err != nil {
				return err
			}
		}
	case []any:
		d, _ := decoded.([]any)
		for i, value := range o {
			if i >= len(d) {
				return fmt.Errorf("%s[%d]: lost in decoding", path, i)
			}
			if err := sameKeys(fmt.Sprintf("%s[%d]", path, i), value, d[i]); err != nil {
				return err
			}
		}
	}
	return nil
}

func isZero(v any) bool {
	switch x := v.(type) {
	case nil:
		return true
	case bool:
		return !x
	case float64:
		return x == 0
	case string:
		return x == ""
	case []any:
		return len(x) == 0
	case map[string]any:
		return len(x) == 0
	}
	return false
}

func TestDecodeStrictRejects(t *testing.T) {
	cases := map[string]string{
		"unknown kind":  "apiVersion: v1\nkind: Pod2\nmetadata: {name: x}\n",
		"unknown field": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndatta: {a: b}\n",
		"wrong case":    "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\nData: {a: b}\n",
		"duplicate key": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata: {a: b}\ndata: {c: d}\n",
		"unknown field in a custom resource": "apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\n" +
			"metadata: {name: x}\nspec: {selector: {}, endpoints: [{port: metrics, scrapeTimeout: 5s}]}\n",
		"unknown nested field": "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\n" +
			"spec: {template: {spec: {containers: [{name: a, image: b, readinessProbe: {httpGet: {path: /readyz, port: 1, hots: x}}}]}}}\n",
	}
	for name, doc := range cases {
		if _, err := decodeStrict([]byte(doc)); err == nil {
			t.Errorf("%s: decoded without error", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
	if _, err := decodeStrict([]byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata: {a: b}\n")); err != nil {
		t.Errorf("a valid ConfigMap: %v", err)
	}
}
