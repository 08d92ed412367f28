# gpu-deps.sh: sourced by the GPU scripts (gpu-check.sh, gpu-cudnn-check.sh,
# bench/gpt2_ddp.sh). The GPU machine lacks some -dev packages gpc builds
# against (cmocka, jansson, libmicrohttpd for gpc serve, possibly OpenBLAS); when ROOT/.deps/cuda holds
# their Debian packages (fetch them on a Debian machine with: mkdir -p
# .deps/cuda && cd .deps/cuda && apt-get download libcmocka-dev libcmocka0
# libjansson-dev libjansson4 libopenblas0-pthread libopenblas-pthread-dev
# libopenblas-dev libopenblas0 libgfortran5 libmicrohttpd-dev
# libmicrohttpd12), they are unpacked into /tmp/gpc-deps and used only for what
# the machine is missing. Sets PKG_CONFIG_PATH and LD_LIBRARY_PATH, and
# gpu_deps_taken to the packages taken from .deps ("" when none).
#
#   source scripts/gpu-deps.sh ROOT
gpu_deps_taken=""
gpu_deps_root=${1:-.}
gpu_deps_prefix=/tmp/gpc-deps
if ls "$gpu_deps_root"/.deps/cuda/*.deb >/dev/null 2>&1; then
  mkdir -p "$gpu_deps_prefix"
  for f in "$gpu_deps_root"/.deps/cuda/*.deb; do dpkg -x "$f" "$gpu_deps_prefix"; done
  gpu_deps_lib=$gpu_deps_prefix/usr/lib/x86_64-linux-gnu
  mkdir -p "$gpu_deps_lib/pkgconfig-gpc"
  if ! pkg-config --exists cmocka; then
    sed "s|/usr|$gpu_deps_prefix/usr|g" "$gpu_deps_lib/pkgconfig/cmocka.pc" >"$gpu_deps_lib/pkgconfig-gpc/cmocka.pc"
    gpu_deps_taken="$gpu_deps_taken cmocka"
  fi
  if ! pkg-config --exists jansson && [ -f "$gpu_deps_lib/pkgconfig/jansson.pc" ]; then
    sed "s|/usr|$gpu_deps_prefix/usr|g" "$gpu_deps_lib/pkgconfig/jansson.pc" >"$gpu_deps_lib/pkgconfig-gpc/jansson.pc"
    gpu_deps_taken="$gpu_deps_taken jansson"
  fi
  if ! pkg-config --exists libmicrohttpd && [ -f "$gpu_deps_lib/pkgconfig/libmicrohttpd.pc" ]; then
    # gnutls is only linked by the library itself: its .pc need not be there
    sed -e "s|/usr|$gpu_deps_prefix/usr|g" -e '/^Requires.private/d' \
      "$gpu_deps_lib/pkgconfig/libmicrohttpd.pc" >"$gpu_deps_lib/pkgconfig-gpc/libmicrohttpd.pc"
    gpu_deps_taken="$gpu_deps_taken libmicrohttpd"
  fi
  if ! pkg-config --exists openblas; then
    sed "s|/usr|$gpu_deps_prefix/usr|g" "$gpu_deps_lib/openblas-pthread/pkgconfig/openblas.pc" \
      >"$gpu_deps_lib/pkgconfig-gpc/openblas.pc"
    export LD_LIBRARY_PATH=$gpu_deps_lib/openblas-pthread:$gpu_deps_lib:${LD_LIBRARY_PATH:-}
    gpu_deps_taken="$gpu_deps_taken openblas"
  fi
  export PKG_CONFIG_PATH=$gpu_deps_lib/pkgconfig-gpc:${PKG_CONFIG_PATH:-}
  export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:$gpu_deps_lib
fi
