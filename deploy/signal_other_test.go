//go:build !unix

package deploy_test

import "os"

var terminate = os.Kill
