#pragma once

/// attnref version, kept in step with project(VERSION) in CMakeLists.txt.
#define ATTNREF_VERSION_MAJOR 0
#define ATTNREF_VERSION_MINOR 1
#define ATTNREF_VERSION_PATCH 0

namespace attnref {
inline constexpr int kVersionMajor = ATTNREF_VERSION_MAJOR;
inline constexpr int kVersionMinor = ATTNREF_VERSION_MINOR;
inline constexpr int kVersionPatch = ATTNREF_VERSION_PATCH;
}  // namespace attnref
