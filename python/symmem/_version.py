# Written by scripts/version.sh from the VERSION file at the repository root
# (the one source of truth); TestVersionAgrees checks it. Do not edit by hand.
__version__ = "0.1.0"
VERSION_MAJOR = 0
VERSION_MINOR = 1
VERSION_PATCH = 0
