module github.com/slidegate/slidegate

go 1.26.0

require (
	github.com/cespare/xxhash/v2 v2.3.0
	github.com/puzpuzpuz/xsync/v3 v3.5.1
	golang.org/x/time v0.16.0
)
