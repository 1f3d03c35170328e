package cuda

import "github.com/libsymmem/libsymmem/include"

func deviceHeaderForTest() string { return include.DeviceHeader }
