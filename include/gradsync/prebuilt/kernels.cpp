// The prebuilt kernels (exec/host.hpp: GRADSYNC_PREBUILT_KERNELS): the host
// reduction of every prebuilt dtype and op, defined once. Build it optimised
// (the top-level meson.build compiles it at the build's level, and at -O2
// under quick_build, whose other prebuilt units are at -O0)
// and link it wherever GRADSYNC_PREBUILT code or the prebuilt collectives'
// units are linked.
#define GRADSYNC_PREBUILT_KERNELS_INSTANTIATE 1
#include <cstdint>

#include <gradsync/exec/host.hpp>

GRADSYNC_PREBUILT_KERNELS(template)
