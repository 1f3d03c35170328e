/*
 * dynlibtest.c - a tiny library for dynlib_test.go: built several times
 * with different -D and -soname options to play a library found by the
 * run-time loader (already loaded, explicit path, wheel or toolkit folder)
 * and one that is too old (no smtest_new).
 */
#ifndef SMTEST_VERSION
#define SMTEST_VERSION 100
#endif

int smtest_version(void) { return SMTEST_VERSION; }
int smtest_old(int x) { return x + 1; }
#ifdef SMTEST_WITH_NEW
int smtest_new(int x) { return x * 2; }
#endif
