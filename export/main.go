// Command export is the C ABI of libsymmem: thin //export functions that
// marshal between C and the Go packages, nothing more. Build it with
// go build -buildmode=c-shared (see the Makefile).
package main

func main() {}
