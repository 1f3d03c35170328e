package core

// Version is MAJOR*10000 + MINOR*100 + PATCH, as SYMMEM_VERSION in
// include/symmem.h. The VERSION file at the repository root is the one source
// of truth: scripts/version.sh writes it here, into the header, the Python
// package, pkg-config and CMake, and TestVersionAgrees checks that they agree.
const Version = 0*10000 + 1*100 + 0

// VersionString is Version as MAJOR.MINOR.PATCH.
const VersionString = "0.1.0"
