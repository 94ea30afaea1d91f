package podcheckpoint

import (
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
