package podcheckpoint

import (
	"math/rand/v2"
	"sort"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cri-shim/cri-shim/internal/podspec"
)

func sourcePod() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ns", UID: "u1", ResourceVersion: "7",
			Labels: map[string]string{"app": "web"}, Annotations: map[string]string{"a": "b"}},
		Spec: corev1.PodSpec{
			NodeName:     "node-a",
			NodeSelector: map[string]string{hostnameLabel: "node-a", "disk": "ssd"},
			Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{
					{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"node-a"}}}}}}}},
			Containers: []corev1.Container{{Name: "main", Image: "busybox",
				VolumeMounts: []corev1.VolumeMount{{Name: "kube-api-access-abcde", MountPath: "/var/run/secrets"}}}},
			Volumes: []corev1.Volume{{Name: "kube-api-access-abcde", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{}}}},
		},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
}

// The template keeps the workload and drops what names this node.
func TestTemplateIsSanitised(t *testing.T) {
	tp := Template(sourcePod())
	if tp.Spec.NodeName != "" || tp.Spec.Affinity != nil || tp.Spec.NodeSelector[hostnameLabel] != "" {
		t.Errorf("node placement kept: %q %+v %v", tp.Spec.NodeName, tp.Spec.Affinity, tp.Spec.NodeSelector)
	}
	if tp.Spec.NodeSelector["disk"] != "ssd" || tp.Labels["app"] != "web" || tp.Annotations["a"] != "b" || tp.Spec.Containers[0].Image != "busybox" {
		t.Errorf("workload lost: %+v", tp)
	}
	if tp.UID != "" || tp.ResourceVersion != "" || tp.Name != "" {
		t.Errorf("instance fields kept: %+v", tp.ObjectMeta)
	}
}

// A restoring pod matches its checkpoint's template after the fields a
// restore changes (node, restore annotation, token volume); otherwise the
// first differing field is named.
func TestSpecMismatch(t *testing.T) {
	tp := Template(sourcePod())
	same := sourcePod()
	same.Spec.NodeName = "node-b"
	same.Annotations[podspec.RestoreFromKey] = "cp"
	same.Spec.Volumes[0].Name = "kube-api-access-zzzzz"
	same.Spec.Containers[0].VolumeMounts[0].Name = "kube-api-access-zzzzz"
	if d, err := SpecMismatch(same, tp); err != nil || d != "" {
		t.Errorf("restore-changed fields: mismatch %q, %v", d, err)
	}
	img := sourcePod()
	img.Spec.Containers[0].Image = "busybox:other"
	if d, _ := SpecMismatch(img, tp); d != "spec.containers[0].image" {
		t.Errorf("image changed: mismatch %q", d)
	}
	more := sourcePod()
	more.Spec.Containers = append(more.Spec.Containers, corev1.Container{Name: "extra", Image: "x"})
	if d, _ := SpecMismatch(more, tp); d != "spec.containers[1]" {
		t.Errorf("container added: mismatch %q", d)
	}
}

// specVariants are pods each differing from sourcePod in one way: some in a
// field a restore may change (so a restore compares them equal), the others
// in the workload.
func specVariants() map[string]func(*corev1.Pod) {
	big := int64(1) << 53
	return map[string]func(*corev1.Pod){
		"node":         func(p *corev1.Pod) { p.Spec.NodeName = "node-b" },
		"restore-from": func(p *corev1.Pod) { p.Annotations[podspec.RestoreFromKey] = "cp" },
		"label":        func(p *corev1.Pod) { p.Labels["app"] = "other" },
		"hostname":     func(p *corev1.Pod) { p.Spec.NodeSelector[hostnameLabel] = "node-b" },
		"no affinity":  func(p *corev1.Pod) { p.Spec.Affinity = nil },
		"empty args":   func(p *corev1.Pod) { p.Spec.Containers[0].Args = []string{} },
		"token volume": func(p *corev1.Pod) {
			p.Spec.Volumes[0].Name = "kube-api-access-zzzzz"
			p.Spec.Containers[0].VolumeMounts[0].Name = "kube-api-access-zzzzz"
		},
		"image":           func(p *corev1.Pod) { p.Spec.Containers[0].Image = "busybox:2" },
		"env":             func(p *corev1.Pod) { p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "K", Value: "v"}} },
		"env value":       func(p *corev1.Pod) { p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "K", Value: "w"}} },
		"disk":            func(p *corev1.Pod) { p.Spec.NodeSelector["disk"] = "hdd" },
		"grace 2^53":      func(p *corev1.Pod) { g := big; p.Spec.TerminationGracePeriodSeconds = &g },
		"grace 2^53+1":    func(p *corev1.Pod) { g := big + 1; p.Spec.TerminationGracePeriodSeconds = &g },
		"grace 0":         func(p *corev1.Pod) { g := int64(0); p.Spec.TerminationGracePeriodSeconds = &g },
		"command":         func(p *corev1.Pod) { p.Spec.Containers[0].Command = []string{"sh"} },
		"command empty":   func(p *corev1.Pod) { p.Spec.Containers[0].Command = []string{""} },
		"another volume":  func(p *corev1.Pod) { p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "data"}) },
		"kube-api- plain": func(p *corev1.Pod) { p.Spec.Volumes[0].Projected = nil },
		"container": func(p *corev1.Pod) {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "extra", Image: "x"})
		},
		"init container":   func(p *corev1.Pod) { p.Spec.InitContainers = []corev1.Container{{Name: "init", Image: "x"}} },
		"host network":     func(p *corev1.Pod) { p.Spec.HostNetwork = true },
		"html characters":  func(p *corev1.Pod) { p.Spec.Containers[0].Args = []string{"<&>"} },
		"unicode escapes":  func(p *corev1.Pod) { p.Spec.Containers[0].Args = []string{"\u2028"} },
		"service account":  func(p *corev1.Pod) { p.Spec.ServiceAccountName = "sa" },
		"restart policy":   func(p *corev1.Pod) { p.Spec.RestartPolicy = corev1.RestartPolicyAlways },
		"pull secret":      func(p *corev1.Pod) { p.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "s"}} },
		"pull secret none": func(p *corev1.Pod) { p.Spec.ImagePullSecrets = []corev1.LocalObjectReference{} },
	}
}

// Two pods have the same SpecDigest exactly when SpecMismatch finds no
// field between them: over every pair of the variants above, alone and
// combined at random (a fixed seed, so a failure repeats).
func TestSpecDigestIsSpecMismatch(t *testing.T) {
	variants := specVariants()
	names := make([]string, 0, len(variants))
	for n := range variants {
		names = append(names, n)
	}
	sort.Strings(names)
	pods := map[string]*corev1.Pod{"source": sourcePod()}
	for _, n := range names {
		p := sourcePod()
		variants[n](p)
		pods[n] = p
	}
	rnd := rand.New(rand.NewPCG(44, 1))
	for i := 0; i < 40; i++ {
		p := sourcePod()
		var applied []string
		for _, n := range names {
			if rnd.IntN(4) == 0 {
				variants[n](p)
				applied = append(applied, n)
			}
		}
		pods["mix "+strings.Join(applied, "+")] = p
	}
	var same, differ int
	for an, a := range pods {
		da, err := SpecDigest(Template(a))
		if err != nil || !validDigest(da) {
			t.Fatalf("%s: digest %q, %v", an, da, err)
		}
		for bn, b := range pods {
			db, _ := SpecDigest(Template(b))
			field, err := SpecMismatch(a, Template(b))
			if err != nil {
				t.Fatalf("%s against %s: %v", an, bn, err)
			}
			if (field == "") != (da == db) {
				t.Errorf("%s against %s: mismatch %q, digests %s and %s", an, bn, field, da, db)
			}
			if field == "" {
				same++
			} else {
				differ++
			}
		}
	}
	if same <= len(pods) || differ == 0 {
		t.Errorf("%d pairs equal, %d differ: the variants do not exercise both outcomes", same, differ)
	}
	// Numbers are compared as written, not through float64.
	a, b := sourcePod(), sourcePod()
	variants["grace 2^53"](a)
	variants["grace 2^53+1"](b)
	if d, _ := SpecMismatch(a, Template(b)); d != "spec.terminationGracePeriodSeconds" {
		t.Errorf("2^53 against 2^53+1: mismatch %q", d)
	}
}
