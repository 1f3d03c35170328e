# Environment for the C tests (sourced by `make test-c` and scripts/gpu_suite.sh
# before each test). check.h compiles the same values in as defaults, so a
# test binary run by hand behaves the same; variables set here win.
#
# libsymmem.so carries a Go runtime. Measured with gcc 12's AddressSanitizer:
#   detect_leaks=1            leak checking stays ON for the tests' own memory;
#   allow_user_segv_handler=1 lets the Go runtime install its SIGSEGV handler
#                             (Go turns faults in Go code into panics and
#                             forwards the others to ASan's handler, which
#                             runs on an alternate stack as Go requires);
#   abort_on_error=0          an ASan report exits with status 1, never
#                             SIGABRT, so it is not mistaken for the
#                             SYMMEM_STRICT abort that test_bad_input expects;
#   protect_shadow_gap=0      needed on the cuda backend: the CUDA driver
#                             reserves addresses inside ASan's shadow gap
#                             (cuInit / first allocation fail with "out of
#                             memory" otherwise); harmless on host.
# LeakSanitizer does not scan the Go heap, so C strings the library interns
# and keeps referenced only from Go look leaked: lsan.supp suppresses leaks
# allocated through libsymmem.so (and libcuda); the tests' own leaks are
# still reported.
_symmem_c_dir=$(cd "$(dirname "${BASH_SOURCE:-$0}")" 2>/dev/null && pwd)
[ -f "$_symmem_c_dir/lsan.supp" ] || _symmem_c_dir=$PWD/tests/c
export ASAN_OPTIONS=detect_leaks=1:allow_user_segv_handler=1:abort_on_error=0:protect_shadow_gap=0
export LSAN_OPTIONS=suppressions=$_symmem_c_dir/lsan.supp:print_suppressions=0
# Group waits in the multi-rank tests give up after 20 s, not 5 minutes.
export SYMMEM_TIMEOUT_MS=20000
unset _symmem_c_dir
