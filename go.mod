module github.com/libsymmem/libsymmem

go 1.26.8

require (
	github.com/mattn/go-pointer v0.0.1 // indirect
	github.com/stretchr/testify v1.12.1 // indirect
	golang.org/x/sys v0.49.0 // indirect
)
