package offload

import "fmt"

func errorf(format string, args ...any) error { return fmt.Errorf("offload: "+format, args...) }
