package podcheckpoint

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/cri-shim/cri-shim/internal/podspec"
)

// hostnameLabel is the node label that names one node.
const hostnameLabel = "kubernetes.io/hostname"

// serviceAccountVolumePrefix starts the name of the token volume the
// ServiceAccount admission plugin adds to every pod, with a random suffix.
const serviceAccountVolumePrefix = "kube-api-access-"

// Template is the pod's metadata and spec as KEP-5823 records it in
// status.checkpointedPodTemplate (here: the data directory's TemplateFile on
// the node holding the checkpoint): labels, annotations and owner references,
// and the spec without what is node-local or specific to this instance
// (spec.nodeName, node selector and affinity terms that name a node, the
// restore-from annotation). Status, UID, resourceVersion and managedFields
// are not part of a PodTemplateSpec at all.
func Template(p *corev1.Pod) *corev1.PodTemplateSpec {
	t := &corev1.PodTemplateSpec{}
	t.Labels = copyMap(p.Labels)
	t.Annotations = copyMap(p.Annotations)
	delete(t.Annotations, podspec.RestoreFromKey)
	if len(t.Annotations) == 0 {
		t.Annotations = nil
	}
	t.OwnerReferences = append(t.OwnerReferences, p.OwnerReferences...)
	t.Spec = *p.Spec.DeepCopy()
	t.Spec.NodeName = ""
	if t.Spec.NodeSelector != nil {
		delete(t.Spec.NodeSelector, hostnameLabel)
		if len(t.Spec.NodeSelector) == 0 {
			t.Spec.NodeSelector = nil
		}
	}
	dropNodeAffinity(&t.Spec)
	return t
}

// dropNodeAffinity removes the required node-affinity terms that pin one
// node (by metadata.name or the hostname label): the scheduler's or a
// restore's placement, not the workload's.
func dropNodeAffinity(s *corev1.PodSpec) {
	a := s.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return
	}
	req := a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	var keep []corev1.NodeSelectorTerm
	for _, term := range req.NodeSelectorTerms {
		if !namesANode(term) {
			keep = append(keep, term)
		}
	}
	if len(keep) > 0 {
		req.NodeSelectorTerms = keep
		return
	}
	a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution = nil
	if a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution == nil {
		a.NodeAffinity = nil
	}
	if a.NodeAffinity == nil && a.PodAffinity == nil && a.PodAntiAffinity == nil {
		s.Affinity = nil
	}
}

func namesANode(t corev1.NodeSelectorTerm) bool {
	for _, f := range t.MatchFields {
		if f.Key == "metadata.name" {
			return true
		}
	}
	for _, e := range t.MatchExpressions {
		if e.Key == hostnameLabel {
			return true
		}
	}
	return false
}

func copyMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// comparable is the spec as a restore compares it: the template's, and the
// ServiceAccount admission plugin's token volume (and its mounts) left out,
// since its name is random per pod.
func comparable(s corev1.PodSpec) corev1.PodSpec {
	s = *s.DeepCopy()
	var vols []corev1.Volume
	dropped := map[string]bool{}
	for _, v := range s.Volumes {
		if strings.HasPrefix(v.Name, serviceAccountVolumePrefix) && v.Projected != nil {
			dropped[v.Name] = true
			continue
		}
		vols = append(vols, v)
	}
	s.Volumes = vols
	strip := func(cs []corev1.Container) {
		for i := range cs {
			var ms []corev1.VolumeMount
			for _, m := range cs[i].VolumeMounts {
				if !dropped[m.Name] {
					ms = append(ms, m)
				}
			}
			cs[i].VolumeMounts = ms
		}
	}
	strip(s.InitContainers)
	strip(s.Containers)
	return s
}

// SpecMismatch compares a restoring pod's spec with a checkpoint's template
// after the fields a restore may change (Template's, above) and returns the
// path of the first field that differs ("spec.containers[0].image"), or ""
// when they match: exactly when SpecDigest(Template(p)) is SpecDigest(t).
func SpecMismatch(p *corev1.Pod, t *corev1.PodTemplateSpec) (string, error) {
	got, err := normalised(Template(p).Spec)
	if err != nil {
		return "", err
	}
	want, err := normalised(t.Spec)
	if err != nil {
		return "", err
	}
	return firstDiff("spec", got, want), nil
}

// SpecDigest is "sha256:" and the hex SHA-256 of the canonical encoding of
// t's spec as SpecMismatch compares it (status.podSpecDigest): the JSON of
// the same normalised tree, object keys sorted (encoding/json's rule for
// maps), numbers as the spec's own encoding wrote them. Two trees
// firstDiff finds equal encode to the same bytes, and distinct trees to
// distinct bytes, so two specs have the same digest exactly when
// SpecMismatch finds no field.
func SpecDigest(t *corev1.PodTemplateSpec) (string, error) {
	v, err := normalised(t.Spec)
	if err != nil {
		return "", err
	}
	b, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("sha256:%x", sha256.Sum256(b)), nil
}

// normalised is the spec a restore compares (comparable's) as a JSON tree:
// objects as map[string]any, numbers as json.Number (the text the spec's
// encoding wrote: no rounding through float64).
func normalised(s corev1.PodSpec) (any, error) {
	b, err := json.Marshal(comparable(s))
	if err != nil {
		return nil, err
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	err = d.Decode(&v)
	return v, err
}

// firstDiff walks two JSON trees in a fixed order (object keys sorted) and
// returns the path of the first difference.
func firstDiff(path string, a, b any) string {
	switch av := a.(type) {
	case map[string]any:
		bv, ok := b.(map[string]any)
		if !ok {
			return path
		}
		keys := make([]string, 0, len(av)+len(bv))
		for k := range av {
			keys = append(keys, k)
		}
		for k := range bv {
			if _, ok := av[k]; !ok {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		for _, k := range keys {
			x, inA := av[k]
			y, inB := bv[k]
			if inA != inB {
				return path + "." + k // a key on one side only, even with null
			}
			if d := firstDiff(path+"."+k, x, y); d != "" {
				return d
			}
		}
		return ""
	case []any:
		bv, ok := b.([]any)
		if !ok {
			return path
		}
		for i := 0; i < len(av) || i < len(bv); i++ {
			if i >= len(av) || i >= len(bv) {
				return fmt.Sprintf("%s[%d]", path, i)
			}
			if d := firstDiff(fmt.Sprintf("%s[%d]", path, i), av[i], bv[i]); d != "" {
				return d
			}
		}
		return ""
	default:
		if !reflect.DeepEqual(a, b) {
			return path
		}
		return ""
	}
}
