package ociartifact

// Annotations and media types of a pod checkpoint image (docs/checkpoint-oci.md).

// Keys defined by cri-shim, on the index and on its descriptors.
const (
	// AnnotationFormat is on the index: its value is FormatName.
	AnnotationFormat = "checkpoint.cri-shim.io/format"
	// AnnotationFormatVersion is on the index: criu.FormatVersion of the
	// checkpoint it holds.
	AnnotationFormatVersion = "checkpoint.cri-shim.io/format-version"
	// AnnotationPodName, AnnotationPodNamespace and AnnotationPodUID are on
	// the index: the pod the checkpoint was taken of (from its manifest).
	AnnotationPodName      = "checkpoint.cri-shim.io/pod-name"
	AnnotationPodNamespace = "checkpoint.cri-shim.io/pod-namespace"
	AnnotationPodUID       = "checkpoint.cri-shim.io/pod-uid"
	// AnnotationCheckpointedAt is on the index: the manifest's
	// checkpointedAt, RFC 3339.
	AnnotationCheckpointedAt = "checkpoint.cri-shim.io/checkpointed-at"
	// AnnotationContainers is on the index: the captured containers in
	// restore order, comma-separated.
	AnnotationContainers = "checkpoint.cri-shim.io/containers"
	// AnnotationRole is on each descriptor of the index: RolePod or
	// RoleContainer.
	AnnotationRole = "checkpoint.cri-shim.io/role"
	// AnnotationContainer is on each container descriptor: the container's
	// name.
	AnnotationContainer = "checkpoint.cri-shim.io/container"
)

// Values of AnnotationFormat and AnnotationRole.
const (
	FormatName    = "pod-checkpoint"
	RolePod       = "pod"
	RoleContainer = "container"
)

// Keys of the container checkpoint image format of CRI-O and checkpointctl
// (checkpointctl lib/annotations.go; CRI-O's checkpoint.name), set on each
// container image's manifest. containerd's CRI restore recognises a
// checkpoint image by AnnotationCRIUContainerName on the manifest it pulled.
const (
	AnnotationCRIOCheckpointName       = "io.kubernetes.cri-o.annotations.checkpoint.name"
	AnnotationCRIUContainerName        = "org.criu.checkpoint.container.name"
	AnnotationCRIUEngine               = "org.criu.checkpoint.engine.name"
	AnnotationCRIUEngineVersion        = "org.criu.checkpoint.engine.version"
	AnnotationCRIURootfsImageName      = "org.criu.checkpoint.rootfsImageName"
	AnnotationCRIURootfsImageRequested = "org.criu.checkpoint.rootfsImageUserRequested"
	AnnotationCRIURootfsImageID        = "org.criu.checkpoint.rootfsImageID"
	AnnotationCRIURuntimeName          = "org.criu.checkpoint.runtime.name"
	AnnotationCRIUCriuVersion          = "org.criu.checkpoint.criu.version"
	AnnotationCRIUHostArch             = "org.criu.checkpoint.host.arch"
	AnnotationCRIUHostKernel           = "org.criu.checkpoint.host.kernel"
)

// AnnotationTitle names a blob's file (OCI image-spec annotations.md).
const AnnotationTitle = "org.opencontainers.image.title"

// Media types.
const (
	// MediaTypePodArtifact is the artifactType of the pod manifest.
	MediaTypePodArtifact = "application/vnd.cri-shim.pod-checkpoint.v1"
	// MediaTypePodManifest is the blob of manifest.json (criu.Manifest).
	MediaTypePodManifest = "application/vnd.cri-shim.pod-checkpoint.manifest.v1+json"
	// MediaTypeSandbox is the blob of sandbox.json (CRI PodSandboxStatusResponse, protojson).
	MediaTypeSandbox = "application/vnd.cri-shim.pod-checkpoint.sandbox.v1+json"
	// MediaTypeEmpty is the config of an artifact manifest (image-spec manifest.md).
	MediaTypeEmpty = "application/vnd.oci.empty.v1+json"
	// MediaTypeLayerTar is a container archive: an uncompressed tar layer.
	MediaTypeLayerTar = "application/vnd.oci.image.layer.v1.tar"
)
