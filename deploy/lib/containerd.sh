# Sourced by deploy/install.sh: the containerd step (--with-containerd). It
# makes cri-shim's runtime shim the runtime of containerd's runc handler and
# changes no other effective setting, which containerd itself confirms:
# `containerd config dump` of the main config before and after, diffed
# (docs/restore-route.md, "The operator step", has the sources this relies on).
#
# Needs ROOT, HERE, TMP, CTRD_BIN, CTRD_MAIN (the main config's path on the
# node), BIN_DIR (where the runtime shim is on the node: /usr/local/bin, or
# the package's /usr/bin), and place/make_dir from files.sh. The drop-ins in
# $HERE/containerd name $BIN_DIR's runtime shim (the package's copies are
# rewritten to /usr/bin by build/deb.sh); ctrd_routes checks that they do.
CTRD_DROPIN=/etc/containerd/conf.d/50-cri-shim.toml
CTRD_IMPORT=/etc/containerd/conf.d/*.toml
RUNTIME_SHIM_PATH=$BIN_DIR/containerd-shim-cri-shim-v2

# ctrd_version FILE: the top-level `version` of a containerd config (0 when
# it has none: containerd reads such a file as version 1).
ctrd_version() {
	awk '/^[[:space:]]*\[/ { exit } match($0, /^[[:space:]]*version[[:space:]]*=[[:space:]]*[0-9]+/) {
		v = substr($0, RSTART, RLENGTH); sub(/.*=[[:space:]]*/, "", v); print v; found = 1; exit }
		END { if (!found) print 0 }' "$1"
}

# ctrd_rebase SRC DST TREE: copies the main config SRC to DST with every
# path in its top-level `imports` made absolute (relative ones are relative
# to the main config's directory, as containerd resolves them:
# cmd/containerd/server/config/config.go, resolveImports) and moved into the
# tree the check reads: under TREE for /etc/containerd and the main config's
# directory when TREE is a staging copy, else under ROOT. Imports named by
# imported files are not rebased (with --root, such nested imports are read
# from the machine's own paths).
ctrd_rebase() {
	local src=$1 dst=$2 tree=$3
	awk -v root="$ROOT" -v tree="$tree" -v dir="$(dirname "$CTRD_MAIN")" '
	function rebase(p) {
		if (substr(p, 1, 1) != "/") p = dir "/" p
		if (tree != "" && (index(p, "/etc/containerd/") == 1 || index(p, dir "/") == 1)) return tree p
		return root p
	}
	/^[[:space:]]*\[/ && !inimp { top = 1 }
	!top && !inimp && /^[[:space:]]*imports[[:space:]]*=/ { inimp = 1 }
	inimp {
		line = $0; out = ""
		while (match(line, /"[^"]*"|\047[^\047]*\047/)) {
			q = substr(line, RSTART, 1)
			out = out substr(line, 1, RSTART - 1) q rebase(substr(line, RSTART + 1, RLENGTH - 2)) q
			line = substr(line, RSTART + RLENGTH)
		}
		$0 = out line
		if (index(line, "]")) inimp = 0
	}
	{ print }' "$src" >"$dst"
}

# ctrd_dump TREE OUT: containerd's effective config (`config dump`, which
# works offline) of the main config as found under TREE (a staging copy) or,
# TREE empty, under ROOT; a missing main config is containerd's defaults.
ctrd_dump() {
	local tree=$1 out=$2 main=${1:-$ROOT}$CTRD_MAIN cfg=$TMP/dump-main.toml
	if [[ -f $main ]]; then
		ctrd_rebase "$main" "$cfg" "$tree"
	else
		cfg=$TMP/no-such-config.toml
	fi
	if ! "$CTRD_BIN" --config "$cfg" config dump >"$out" 2>"$out.err"; then
		echo "install.sh: $CTRD_BIN config dump of $CTRD_MAIN failed:" >&2
		sed 's/^/  /' "$out.err" >&2
		return 1
	fi
}

# ctrd_unexpected BEFORE AFTER: the changed lines other than the import list
# (it names the check's rebased paths) and the runtime_path the drop-in sets.
ctrd_unexpected() {
	diff "$1" "$2" | grep '^[<>]' | grep -Ev "^[<>][[:space:]]*(imports|runtime_path) = " || true
}

# ctrd_routes DUMP: the dump's runc handler runs the runtime shim.
ctrd_routes() {
	awk -v want="runtime_path = '$RUNTIME_SHIM_PATH'" '
		/^[[:space:]]*\[/ { inrunc = ($0 ~ /\.containerd\.runtimes\.runc\]$/) }
		inrunc && index($0, want) { found = 1 }
		END { exit !found }' "$1"
}

# ctrd_add_import FILE: adds conf.d/*.toml to a main config's top-level
# imports (first, so that the operator's own imports still win), or an
# imports line before its first table.
ctrd_add_import() {
	local f=$1
	if awk '/^[[:space:]]*\[/ { exit } /^[[:space:]]*imports[[:space:]]*=/ { found = 1; exit } END { exit !found }' "$f"; then
		awk -v imp="'$CTRD_IMPORT', " '!done && /^[[:space:]]*imports[[:space:]]*=[[:space:]]*\[/ { sub(/\[/, "[" imp); done = 1 } { print }' "$f" >"$f.new"
	else
		awk -v imp="imports = ['$CTRD_IMPORT']" '!done && /^[[:space:]]*\[/ { print imp; print ""; done = 1 } { print } END { if (!done) print imp }' "$f" >"$f.new"
	fi
	mv -f "$f.new" "$f"
}

# ctrd_stage VERSION TREE: a copy of the node's containerd files under TREE
# with the drop-in for a main config of VERSION, and the main config made to
# import conf.d if it does not read the drop-in already; a node without a
# main config gets one that is containerd's defaults plus that import.
# Sets CTRD_NEW_MAIN (1: the main config is new or changed).
ctrd_stage() {
	local v=$1 tree=$2 d
	rm -rf "$tree"
	for d in /etc/containerd "$(dirname "$CTRD_MAIN")"; do
		mkdir -p "$tree$d"
		if [[ -d $ROOT$d ]]; then cp -a "$ROOT$d/." "$tree$d/"; fi
	done
	mkdir -p "$tree$(dirname "$CTRD_DROPIN")"
	local src=$HERE/containerd/50-cri-shim.toml
	[[ $v == 2 ]] && src=$HERE/containerd/v2/50-cri-shim.toml
	cp "$src" "$tree$CTRD_DROPIN"
	CTRD_NEW_MAIN=
	if [[ ! -f $tree$CTRD_MAIN ]]; then
		# Version 3: the version all of containerd 2.2 to 2.4 read as such
		# (2.3 and 2.4 migrate it to 4 as they load it); no other key, so
		# every setting stays containerd's default, release by release.
		printf '# Written by cri-shim deploy/install.sh: containerd'"'"'s defaults, and the drop-ins.\nversion = 3\nimports = [%s]\n' "'$CTRD_IMPORT'" >"$tree$CTRD_MAIN"
		CTRD_NEW_MAIN=1
		return 0
	fi
	ctrd_dump "$tree" "$TMP/staged.dump" || return 1
	if ! ctrd_routes "$TMP/staged.dump"; then
		ctrd_add_import "$tree$CTRD_MAIN"
		CTRD_NEW_MAIN=1
	fi
}

# ctrd_plan: stages the drop-in (the one for the main config's version
# first, then the other) and keeps the first staging whose effective config
# differs from the node's in the runc handler's runtime_path only. Sets
# CTRD_TREE (the staging copy) and CTRD_CHANGED (1: the effective config
# changes, containerd needs a restart). Fails, having changed nothing, when
# no staging passes; prints the diff of each.
ctrd_plan() {
	local main=$ROOT$CTRD_MAIN v candidates=(3 2) bad
	[[ -f $main && $(ctrd_version "$main") == 2 ]] && candidates=(2 3)
	ctrd_dump "" "$TMP/before.dump" || return 1
	for v in "${candidates[@]}"; do
		CTRD_TREE=$TMP/stage-v$v
		ctrd_stage "$v" "$CTRD_TREE" || return 1
		ctrd_dump "$CTRD_TREE" "$TMP/after.dump" || return 1
		bad=$(ctrd_unexpected "$TMP/before.dump" "$TMP/after.dump")
		if [[ -z $bad ]] && ctrd_routes "$TMP/after.dump"; then
			CTRD_VERSION=$v
			CTRD_CHANGED=
			diff -q "$TMP/before.dump" "$TMP/after.dump" >/dev/null || CTRD_CHANGED=1
			cp "$TMP/after.dump" "$TMP/planned.dump"
			echo "containerd: a version $v drop-in; the effective config (containerd config dump) changes in:"
			bad=$(diff "$TMP/before.dump" "$TMP/after.dump" | grep '^[<>]' | grep -v '^[<>][[:space:]]*imports = ' || true)
			if [[ -n $bad ]]; then printf '%s\n' "$bad" | sed 's/^/  /'; else echo "  nothing (already in place)"; fi
			return 0
		fi
		if [[ -n $bad ]]; then
			echo "install.sh: with a version $v drop-in, containerd's effective config would change beyond the runc handler's runtime_path:" >&2
			printf '%s\n' "$bad" | sed 's/^/  /' >&2
		else
			echo "install.sh: with a version $v drop-in, the runc handler would still not run $RUNTIME_SHIM_PATH (does a later import set its runtime_path?)" >&2
		fi
	done
	echo "install.sh: not changing containerd's configuration; see docs/restore-route.md, \"The operator step\"" >&2
	return 1
}

# ctrd_apply: places the planned files (the drop-in, and the main config if it
# is new or changed), then checks the node's own files the same way; on any
# difference from the plan it puts the previous files back and fails.
ctrd_apply() {
	local prev=$TMP/ctrd-prev f changed=
	mkdir -p "$prev"
	for f in "$CTRD_DROPIN" "$CTRD_MAIN"; do
		if [[ -f $ROOT$f ]]; then mkdir -p "$prev$(dirname "$f")"; cp -p "$ROOT$f" "$prev$f"; fi
	done
	place "$CTRD_TREE$CTRD_DROPIN" "$CTRD_DROPIN" 0644 ours && changed=1
	if [[ -n $CTRD_NEW_MAIN ]]; then
		place "$CTRD_TREE$CTRD_MAIN" "$CTRD_MAIN" 0644 && changed=1
	fi
	[[ -n $DRY ]] && return 0
	ctrd_dump "" "$TMP/placed.dump" || true
	if [[ -n $(ctrd_unexpected "$TMP/planned.dump" "$TMP/placed.dump") ]] || ! ctrd_routes "$TMP/placed.dump"; then
		echo "install.sh: containerd's effective config from the installed files is not the planned one; putting the previous files back:" >&2
		diff "$TMP/planned.dump" "$TMP/placed.dump" | grep '^[<>]' | sed 's/^/  /' >&2 || true
		for f in "$CTRD_DROPIN" "$CTRD_MAIN"; do
			if [[ -f $prev$f ]]; then cp -p "$prev$f" "$ROOT$f"; else unplace "$f"; fi
		done
		return 1
	fi
	[[ -n $changed ]] || CTRD_CHANGED=
	return 0
}
