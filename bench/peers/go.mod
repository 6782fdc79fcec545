module github.com/slidegate/slidegate/bench/peers

go 1.26.0

replace github.com/slidegate/slidegate => ../..

require (
	github.com/cespare/xxhash/v2 v2.3.0
	github.com/go-chi/httprate v0.16.1
	github.com/puzpuzpuz/xsync/v3 v3.5.1
	github.com/sethvargo/go-limiter v0.7.1
	github.com/slidegate/slidegate v0.0.0-00010101000000-000000000000
	github.com/throttled/throttled/v2 v2.15.0
	github.com/ulule/limiter/v3 v3.11.2
	go.uber.org/goleak v1.3.0
	golang.org/x/time v0.16.0
)

require (
	github.com/hashicorp/golang-lru v0.5.4 // indirect
	github.com/klauspost/cpuid/v2 v2.2.10 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/zeebo/xxh3 v1.0.2 // indirect
	golang.org/x/sys v0.48.0 // indirect
)
