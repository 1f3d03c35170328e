package core

// Version is MAJOR*10000 + MINOR*100 + PATCH, as SYMMEM_VERSION in
// include/symmem.h; the two must agree (the C tests check it).
const Version = 0*10000 + 1*100 + 0
