// gradsync: configuration macros shared by every header.
#pragma once

#define GRADSYNC_VERSION_MAJOR 0
#define GRADSYNC_VERSION_MINOR 1
#define GRADSYNC_VERSION_PATCH 0

// Marks per-element math that must run identically on host and device.
#if defined(__CUDACC__)
#define GRADSYNC_HD __host__ __device__
#define GRADSYNC_DEVICE_COMPILE 1
#else
#define GRADSYNC_HD
#endif
