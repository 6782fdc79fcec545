//go:build unix

package deploy_test

import "syscall"

var terminate = syscall.SIGTERM
