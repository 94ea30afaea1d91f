#!/usr/bin/env bash
# Generates the deepcopy code of pkg/apis and the CRDs in deploy/crd with
# controller-gen, pinned by this directory's go.mod (make generate).
#
#   build/codegen/generate.sh           write into the tree
#   build/codegen/generate.sh OUTDIR    write into OUTDIR/<same relative paths>
#                                       instead (the staleness test compares)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
go=${GO:-go}
bin=${CONTROLLER_GEN:-$repo/_output/bin/controller-gen}
(cd "$repo/build/codegen" && "$go" build -o "$bin" sigs.k8s.io/controller-tools/cmd/controller-gen)
cd "$repo"
out=${1:-$repo}
for pkg in pkg/apis/*/*/; do
	pkg=${pkg%/}
	mkdir -p "$out/$pkg"
	"$bin" object paths="./$pkg" output:object:dir="$out/$pkg"
done
mkdir -p "$out/deploy/crd"
"$bin" crd:crdVersions=v1 paths=./pkg/apis/... output:crd:artifacts:config="$out/deploy/crd"
