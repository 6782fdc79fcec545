module github.com/slidegate/slidegate/lab/bench/peers

go 1.26.0

replace (
	github.com/slidegate/slidegate => ../../..
	github.com/slidegate/slidegate/cmd/slidegate => ../../../cmd/slidegate
	github.com/slidegate/slidegate/deploy => ../../../deploy
	github.com/slidegate/slidegate/grpclimit => ../../../grpclimit
	github.com/slidegate/slidegate/lab => ../../../lab
	github.com/slidegate/slidegate/redisstore => ../../../redisstore
	github.com/slidegate/slidegate/remote => ../../../remote
	github.com/slidegate/slidegate/internal/rls => ../../../internal/rls
	github.com/slidegate/slidegate/internal/server => ../../../internal/server
)

require (
	github.com/cespare/xxhash/v2 v2.3.0
	github.com/go-chi/httprate v0.16.1
	github.com/puzpuzpuz/xsync/v3 v3.5.1
	github.com/sethvargo/go-limiter v0.7.1
	github.com/slidegate/slidegate v0.0.0-00010101000000-000000000000
	github.com/slidegate/slidegate/lab v0.0.0-00010101000000-000000000000
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
	golang.org/x/sys v0.50.0 // indirect
)
