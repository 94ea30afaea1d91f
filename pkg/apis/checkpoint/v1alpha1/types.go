package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// PodCheckpoint asks the node that runs a pod to checkpoint it, and records
// the result (KEP-5823's object, in cri-shim's own group).
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=pcp,categories=checkpoint
// +kubebuilder:selectablefield:JSONPath=`.spec.sourcePodName`
// +kubebuilder:selectablefield:JSONPath=`.status.nodeName`
// +kubebuilder:selectablefield:JSONPath=`.status.export.digest`
// +kubebuilder:printcolumn:name="Source Pod",type=string,JSONPath=`.spec.sourcePodName`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.status.nodeName`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Size",type=integer,format=int64,JSONPath=`.status.sizeBytes`
// +kubebuilder:printcolumn:name="Source Image",type=string,priority=1,JSONPath=`.spec.sourceImage`
// +kubebuilder:printcolumn:name="Last Restore",type=string,priority=1,JSONPath=`.status.lastRestore.podName`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type PodCheckpoint struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec names the pod to checkpoint, or a checkpoint in a registry. It is
	// immutable after creation.
	// +required
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec is immutable"
	// +kubebuilder:validation:XValidation:rule="has(self.sourcePodName) != has(self.sourceImage)",message="exactly one of spec.sourcePodName and spec.sourceImage must be set"
	// +kubebuilder:validation:XValidation:rule="!has(self.sourceImage) || (!has(self.sourcePodUID) && !has(self.timeoutSeconds) && !has(self.export))",message="spec.sourcePodUID, spec.timeoutSeconds and spec.export belong to spec.sourcePodName"
	Spec PodCheckpointSpec `json:"spec"`

	// status is written by the node that runs the source pod; read-only for users.
	// +optional
	Status PodCheckpointStatus `json:"status,omitempty"`
}

// PodCheckpointList is a list of PodCheckpoint objects.
//
// +kubebuilder:object:root=true
type PodCheckpointList struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []PodCheckpoint `json:"items"`
}

// PodCheckpointSpec names the pod to checkpoint and bounds the operation,
// or names a pod checkpoint in a registry.
type PodCheckpointSpec struct {
	// sourcePodName is the name of the running pod, in the PodCheckpoint's
	// namespace, to checkpoint (KEP-5823). Exactly one of sourcePodName and
	// sourceImage is set.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	SourcePodName string `json:"sourcePodName,omitempty"`

	// sourceImage names a pod checkpoint in a registry, by digest
	// (host[:port]/repository@sha256:<64 hex>), instead of a pod to
	// checkpoint: no node takes a checkpoint for it, and a pod naming the
	// object in checkpoint.cri-shim.io/restore-from is restored from the
	// image by the node that runs it (docs/checkpoint-oci.md: that node's
	// registry allow-list, the pod's image pull secrets, the namespace
	// binding).
	// +optional
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:Pattern=`^[a-z0-9.:\[\]-]+/[^@\s]+@sha256:[0-9a-f]{64}$`
	SourceImage string `json:"sourceImage,omitempty"`

	// sourcePodUID, if set, pins the checkpoint to that pod instance: a live
	// pod of the same name with another UID fails it (SourcePodReplaced).
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	SourcePodUID *types.UID `json:"sourcePodUID,omitempty"`

	// timeoutSeconds bounds the checkpoint; nil or 0 uses the node's default.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=86400
	TimeoutSeconds *int32 `json:"timeoutSeconds,omitempty"`

	// export, if set, makes the node holding the checkpoint push it to a
	// registry once it is Ready; status.export records where.
	// +optional
	Export *PodCheckpointExport `json:"export,omitempty"`
}

// PodCheckpointExport says where the node pushes the checkpoint.
type PodCheckpointExport struct {
	// image is the repository, with an optional tag, pushed to:
	// host[:port]/repository[:tag]. Its registry must be in the node's
	// [checkpoint] registries allow-list.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:Pattern=`^[a-z0-9.:\[\]-]+/[^@\s]+$`
	Image string `json:"image"`

	// secretName, if set, is a kubernetes.io/dockerconfigjson secret of the
	// object's namespace whose credentials the push uses; the source pod
	// must list it in imagePullSecrets (a node reads only the secrets of its
	// pods). Unset: the push is anonymous (never with the node's own
	// credentials).
	// +optional
	// +kubebuilder:validation:MaxLength=253
	SecretName string `json:"secretName,omitempty"`
}

// PodCheckpointStatus is the observed state of the checkpoint.
type PodCheckpointStatus struct {
	// nodeName is the node that runs (ran) the source pod and holds the data.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	NodeName string `json:"nodeName,omitempty"`

	// sourcePodUID is the UID of the pod instance checkpointed (or being checkpointed).
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=128
	SourcePodUID *types.UID `json:"sourcePodUID,omitempty"`

	// checkpointLocation is where the data is; set when the checkpoint is Ready.
	// +optional
	CheckpointLocation *CheckpointSource `json:"checkpointLocation,omitempty"`

	// completionTime is when the checkpoint was written and became Ready.
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`

	// podSpecDigest is "sha256:" and the hex SHA-256 of the canonical
	// encoding of the source pod's spec as a restore compares it: the
	// sanitised template's spec less what a restore may change
	// (podcheckpoint.SpecDigest). A pod restoring from the object on any node
	// must have the same digest. The template itself (KEP-5823's
	// checkpointedPodTemplate, the pod's metadata and spec, env values
	// included) stays on status.nodeName, in the checkpoint's data
	// directory: every node may read every PodCheckpoint, and the Node
	// authorizer lets a node read only the pods bound to it.
	// +optional
	// +kubebuilder:validation:MaxLength=71
	// +kubebuilder:validation:Pattern=`^sha256:[0-9a-f]{64}$`
	PodSpecDigest string `json:"podSpecDigest,omitempty"`

	// checkpointedContainers lists the regular containers captured.
	// +optional
	// +listType=map
	// +listMapKey=name
	CheckpointedContainers []PodCheckpointContainerStatus `json:"checkpointedContainers,omitempty"`

	// checkpointedInitContainers lists the init containers captured: completed
	// ones and running sidecars.
	// +optional
	// +listType=map
	// +listMapKey=name
	CheckpointedInitContainers []PodCheckpointContainerStatus `json:"checkpointedInitContainers,omitempty"`

	// sizeBytes is the size of the checkpoint data on the node.
	// +optional
	// +kubebuilder:validation:Minimum=0
	SizeBytes int64 `json:"sizeBytes,omitempty"`

	// export records the push of spec.export once it succeeded.
	// +optional
	Export *PodCheckpointExportStatus `json:"export,omitempty"`

	// sourceImage is what the node holding an object with spec.sourceImage
	// found at that reference: the image index's annotations (a pull checks
	// them against the checkpoint itself). Set when Ready is
	// SourceImageResolved; kept through later failures, dated by resolvedTime.
	// +optional
	SourceImage *PodCheckpointSourceImageStatus `json:"sourceImage,omitempty"`

	// lastRestore is the newest pod whose restore from this object the
	// holding node resolved (its RunPodSandbox; the warm start follows, and
	// the pod's events say how it went). Restores on other nodes are not
	// recorded. Written for objects with spec.sourceImage.
	// +optional
	LastRestore *PodCheckpointRestoreStatus `json:"lastRestore,omitempty"`

	// conditions: the Ready condition is the single source of truth for the
	// checkpoint's progress (reasons below); Exported that of spec.export.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// PodCheckpointExportStatus is the pushed checkpoint.
type PodCheckpointExportStatus struct {
	// image is the pushed image index by digest: repository@sha256:...
	// +kubebuilder:validation:MaxLength=512
	Image string `json:"image"`
	// digest is the image index's digest.
	// +kubebuilder:validation:MaxLength=128
	Digest string `json:"digest"`
	// completionTime is when the push ended.
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
}

// PodCheckpointSourceImageStatus describes the pod checkpoint that
// spec.sourceImage names, as its image index's annotations say.
type PodCheckpointSourceImageStatus struct {
	// digest is the image index's digest, as the registry served it.
	// +kubebuilder:validation:MaxLength=128
	Digest string `json:"digest"`
	// podNamespace is the namespace of the pod the checkpoint was taken of.
	// +kubebuilder:validation:MaxLength=63
	PodNamespace string `json:"podNamespace"`
	// podName is the name of that pod.
	// +kubebuilder:validation:MaxLength=253
	PodName string `json:"podName"`
	// podUID is that pod's UID.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=128
	PodUID types.UID `json:"podUID,omitempty"`
	// checkpointedAt is when the checkpoint was taken.
	// +optional
	CheckpointedAt *metav1.Time `json:"checkpointedAt,omitempty"`
	// containers are the captured containers, in restore order.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=63
	Containers []string `json:"containers,omitempty"`
	// resolvedTime is when the node last resolved the reference.
	ResolvedTime metav1.Time `json:"resolvedTime"`
}

// PodCheckpointRestoreStatus is a pod restored from the object.
type PodCheckpointRestoreStatus struct {
	// podName is the restoring pod, in the object's namespace.
	// +kubebuilder:validation:MaxLength=253
	PodName string `json:"podName"`
	// podUID is the restoring pod's UID.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=128
	PodUID types.UID `json:"podUID,omitempty"`
	// nodeName is the node the pod runs on.
	// +kubebuilder:validation:MaxLength=253
	NodeName string `json:"nodeName"`
	// time is when the node resolved the restore.
	Time metav1.Time `json:"time"`
}

// PodCheckpointContainerStatus identifies a container captured in the checkpoint.
type PodCheckpointContainerStatus struct {
	// name of the container.
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name"`
	// image the container ran at checkpoint time.
	// +kubebuilder:validation:MaxLength=4096
	Image string `json:"image"`
}

// CheckpointSource says where a checkpoint's data is: a union keyed by type.
//
// +union
// +kubebuilder:validation:XValidation:rule="self.type == 'NodeLocal' ? has(self.nodeLocal) : !has(self.nodeLocal)",message="nodeLocal is set exactly when type is NodeLocal"
type CheckpointSource struct {
	// type is the backend holding the data; only NodeLocal exists.
	// +unionDiscriminator
	// +kubebuilder:validation:Enum=NodeLocal
	Type CheckpointSourceType `json:"type"`
	// nodeLocal locates data kept on status.nodeName.
	// +optional
	NodeLocal *NodeLocalCheckpointSource `json:"nodeLocal,omitempty"`
}

// CheckpointSourceType enumerates the checkpoint storage backends.
type CheckpointSourceType string

// CheckpointSourceTypeNodeLocal: the data is on the node that took it.
const CheckpointSourceTypeNodeLocal CheckpointSourceType = "NodeLocal"

// NodeLocalCheckpointSource locates a checkpoint on the node that took it.
type NodeLocalCheckpointSource struct {
	// path is the checkpoint's directory relative to the node's checkpoint
	// root (cri-shim's [checkpoint] root): one path element, never absolute.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9._-]+$`
	// +kubebuilder:validation:XValidation:rule="self != '.' && self != '..'",message="path must name a directory under the checkpoint root"
	Path string `json:"path"`
}

// ConditionReady is the type of the summary condition of a PodCheckpoint.
const ConditionReady = "Ready"

// ConditionExported is the type of the condition of spec.export.
const ConditionExported = "Exported"

// Reasons of the Exported condition.
const (
	// ReasonExportInProgress: status False, the node is pushing.
	ReasonExportInProgress = "ExportInProgress"
	// ReasonExported: status True, status.export is set.
	ReasonExported = "ExportCompleted"
	// ReasonExportFailed: status False; the node tries again a minute later.
	ReasonExportFailed = "ExportFailed"
)

// Reasons of the Ready condition.
const (
	// ReasonPending: status False, nothing done yet.
	ReasonPending = "Pending"
	// ReasonInProgress: status False, the node is checkpointing.
	ReasonInProgress = "CheckpointInProgress"
	// ReasonCompleted: status True, the data is written.
	ReasonCompleted = "CheckpointCompleted"
	// ReasonFailed: status False, terminal; the message says why.
	ReasonFailed = "CheckpointFailed"
	// ReasonSourcePodReplaced: status False, terminal; the live pod's UID is
	// not spec.sourcePodUID (or not the UID the node pinned).
	ReasonSourcePodReplaced = "SourcePodReplaced"
)

// Reasons of the Ready condition of an object with spec.sourceImage,
// written by the node that holds it: the first node that restores a pod
// from it (docs/podcheckpoint.md, "Status of an object with
// spec.sourceImage"). Before that the object has no status; the holder
// writes nodeName with the first outcome (no Pending claim before it; objects
// claimed by earlier builds may show ReasonPending until the holder's next
// check). None is terminal: the next restore checks again.
const (
	// ReasonSourceImageResolved: status True; the registry serves a pod
	// checkpoint at the reference that pods of the namespace may restore;
	// status.sourceImage describes it.
	ReasonSourceImageResolved = "SourceImageResolved"
	// ReasonSourceImageInvalid: status False; the reference breaks the
	// node's rules (registry host spelt out, sha256 digest, repository form).
	ReasonSourceImageInvalid = "SourceImageInvalid"
	// ReasonRegistryNotAllowed: status False; the repository is not in the
	// holding node's [checkpoint] registries allow-list for the namespace.
	ReasonRegistryNotAllowed = "RegistryNotAllowed"
	// ReasonSourceImageNotFound: status False; nothing the namespace may
	// restore is readable there: the registry answered 404, 401 or 403, or
	// only the node's credentials read something the namespace may not
	// restore (one answer, so that it tells nothing of repositories the
	// namespace cannot read).
	ReasonSourceImageNotFound = "SourceImageNotFound"
	// ReasonSourceImageUnauthorized is no longer set: a refusal of the
	// credentials is SourceImageNotFound.
	ReasonSourceImageUnauthorized = "SourceImageUnauthorized"
	// ReasonNotAPodCheckpoint: status False; the image, read with the
	// restoring pod's secrets or anonymously, is not a cri-shim pod
	// checkpoint this node restores.
	ReasonNotAPodCheckpoint = "NotAPodCheckpoint"
	// ReasonNamespaceNotAllowed: status False; the checkpoint, read with the
	// restoring pod's secrets or anonymously, was taken in a namespace whose
	// checkpoints pods of this one may not restore.
	ReasonNamespaceNotAllowed = "NamespaceNotAllowed"
	// ReasonSourceImageUnreachable: status False; the registry, or the API
	// server for the restoring pod's pull secrets, did not answer, or the
	// restoring pod could not be read as the restore's (the message says
	// which).
	ReasonSourceImageUnreachable = "SourceImageUnreachable"
)
