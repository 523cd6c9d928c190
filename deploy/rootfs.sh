# Building blocks for images assembled FROM scratch (sourced by deploy/images.sh and
# tests/images/build.sh). No base image can be pulled where these images are built, so each image's
# root filesystem is staged here: the program, the shared libraries it links (as ldd resolves them
# on the build machine), a passwd and group file naming root and the unprivileged uid 65532.

# Copies executable $2 into root $1 at path $3 (default: the same path), stripped of its debug
# information, plus every shared library it needs at the path the loader looks for it.
# With $DEBUG_DIR set, the debug information is kept there as <name>.debug (and linked from the
# stripped binary, so a debugger finds it).
rootfs_add_program() {
  local root="$1" src="$2" dest="${3:-$2}"
  install -d "$root$(dirname "$dest")"
  if file_is_elf "$src" && [[ -n "${DEBUG_DIR:-}" ]]; then
    install -d "$DEBUG_DIR"
    local debug="$DEBUG_DIR/$(basename "$dest").debug"
    objcopy --only-keep-debug "$src" "$debug"
    strip --strip-debug --strip-unneeded -o "$root$dest" "$src"
    objcopy --add-gnu-debuglink="$debug" "$root$dest"
  elif file_is_elf "$src"; then
    strip --strip-debug --strip-unneeded -o "$root$dest" "$src"
  else
    cp "$src" "$root$dest"
  fi
  chmod 0755 "$root$dest"
  rootfs_add_libraries "$root" "$src"
}

# The shared libraries (and the loader) executable $2 links, copied into root $1. A static
# executable needs none.
rootfs_add_libraries() {
  local root="$1" src="$2" lib
  file_is_dynamic "$src" || return 0
  # ldd prints "name => /path (addr)" per library and "/lib64/ld-linux... (addr)" for the loader.
  while read -r lib; do
    [[ -e "$root$lib" ]] && continue
    install -d "$root$(dirname "$lib")"
    # The file the name resolves to, under the name the loader asks for.
    cp -L "$lib" "$root$lib"
  done < <(ldd "$src" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }')
}

# /etc/passwd and /etc/group with root and nonroot (65532), the uid ferry's images run as.
rootfs_add_users() {
  local root="$1"
  install -d "$root/etc"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$root/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$root/etc/group"
  install -d -m 0755 "$root/home/nonroot"
  chown 65532:65532 "$root/home/nonroot"
}

file_is_elf() {
  [[ "$(head -c 4 "$1" | od -An -c | tr -d ' ')" == '177ELF' ]]
}

file_is_dynamic() {
  file_is_elf "$1" && ldd "$1" >/dev/null 2>&1
}

# A stable digest of a staged root: names, modes, owners and contents, not timestamps. Used as the
# image's content tag, so an unchanged image is neither rebuilt nor pushed again.
rootfs_digest() {
  (cd "$1" && find . -print0 | LC_ALL=C sort -z |
    xargs -0 stat -c '%n %a %u %g %F' && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum) |
    sha256sum | cut -c1-16
}
