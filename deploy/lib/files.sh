# Sourced by deploy/install.sh: the files install.sh places, recorded so that
# a re-run converges and --uninstall puts the node back as it was.
#
# $ROOT/var/lib/cri-shim-install/files lists, one a line, "f PATH" for a file
# install.sh placed and "d PATH" for a directory it created (PATH as on the
# node). A file that existed before install.sh first replaced it is kept
# under backup/PATH and put back by --uninstall; a file it created is removed.
# Needs ROOT and DRY (non-empty: print, change nothing).
STATE_DIR=$ROOT/var/lib/cri-shim-install
MANIFEST=$STATE_DIR/files
BACKUP=$STATE_DIR/backup

recorded() { [[ -f $MANIFEST ]] && grep -qxF "$1" "$MANIFEST"; }

# record ENTRY: adds "f PATH" or "d PATH" to the record; the record's own
# directory, and any parents of it install.sh creates, are recorded too.
record() {
	recorded "$1" && return 0
	if [[ ! -d $STATE_DIR ]]; then
		local p=${STATE_DIR#"$ROOT"} missing=()
		p=$(dirname "$p")
		while [[ $p != / && ! -d $ROOT$p ]]; do
			missing=("$p" "${missing[@]}")
			p=$(dirname "$p")
		done
		install -d -m 0700 "$STATE_DIR"
		for p in "${missing[@]}"; do printf 'd %s\n' "$p" >>"$MANIFEST"; done
	fi
	printf '%s\n' "$1" >>"$MANIFEST"
}

# make_dir PATH: creates PATH (and its missing parents) under ROOT, recording
# each directory it creates.
make_dir() {
	local p=$1 missing=()
	while [[ $p != / && ! -d $ROOT$p ]]; do
		missing=("$p" "${missing[@]}")
		p=$(dirname "$p")
	done
	for p in "${missing[@]}"; do
		install -d -m 0755 "$ROOT$p"
		record "d $p"
	done
}

# place SRC PATH MODE [keep]: installs SRC at PATH (on the node) with MODE,
# atomically (a rename). An existing file install.sh did not place is backed
# up first unless the 4th argument is "ours" (the path is cri-shim's own: an
# older install put it there without a record). Returns 0 when PATH changed,
# 1 when it already had this content and mode. With DRY, says what it would
# do and changes nothing.
place() {
	local src=$1 path=$2 mode=$3 kind=${4:-} dst=$ROOT$2
	if [[ -f $dst ]] && cmp -s "$src" "$dst" && [[ $(stat -c %a "$dst") == "${mode#0}" ]]; then
		[[ -n $DRY ]] || record "f $path"
		return 1
	fi
	if [[ -n $DRY ]]; then
		if [[ -e $dst ]]; then
			echo "would replace $path:"
			diff -u "$dst" "$src" | sed 's/^/    /' || true
		else
			echo "would install $path"
			[[ $path != /etc/* ]] || sed 's/^/    /' "$src"
		fi
		return 0
	fi
	make_dir "$(dirname "$path")"
	if ! recorded "f $path"; then
		if [[ -e $dst && $kind != ours ]]; then
			install -d -m 0700 "$BACKUP$(dirname "$path")"
			cp -p "$dst" "$BACKUP$path"
		fi
		record "f $path"
	fi
	install -m "$mode" "$src" "$dst.cri-shim-new"
	mv -f "$dst.cri-shim-new" "$dst"
	return 0
}

# unplace PATH: puts back what PATH was before install.sh first placed it
# (the backup), or removes it; forgets it.
unplace() {
	local path=$1
	if [[ -n $DRY ]]; then
		if [[ -e $BACKUP$path ]]; then echo "would restore $path"; else echo "would remove $path"; fi
		return 0
	fi
	if [[ -e $BACKUP$path ]]; then
		mv -f "$BACKUP$path" "$ROOT$path"
	else
		rm -f "$ROOT$path"
	fi
	forget "f $path"
}

forget() {
	[[ -f $MANIFEST ]] || return 0
	grep -vxF "$1" "$MANIFEST" >"$MANIFEST.new" || true
	mv -f "$MANIFEST.new" "$MANIFEST"
}

# placed PATTERN: the recorded files whose path matches the extended regexp.
placed() {
	[[ -f $MANIFEST ]] || return 0
	sed -n 's/^f //p' "$MANIFEST" | grep -E "$1" || true
}

# unplace_all: every recorded file back (or away), then every directory
# install.sh created, deepest first, if empty; then the record itself.
unplace_all() {
	local path dirs
	[[ -f $MANIFEST ]] || return 0
	while read -r path; do unplace "$path"; done < <(placed .)
	mapfile -t dirs < <(sed -n 's/^d //p' "$MANIFEST" | sort -r)
	if [[ -n $DRY ]]; then
		for path in "${dirs[@]}"; do echo "would remove directory $path (if empty)"; done
		return 0
	fi
	rm -f "$MANIFEST"
	find "$BACKUP" -depth -type d -empty -delete 2>/dev/null || true
	rmdir "$STATE_DIR" 2>/dev/null || echo "kept ${STATE_DIR#"$ROOT"}: not empty" >&2
	for path in "${dirs[@]}"; do
		rmdir "$ROOT$path" 2>/dev/null || echo "kept $path: not empty" >&2
	done
}
