module github.com/slidegate/slidegate/lab/bench/redispeers

go 1.26.0

replace (
	github.com/slidegate/slidegate => ../../..
	github.com/slidegate/slidegate/cmd/slidegate => ../../../cmd/slidegate
	github.com/slidegate/slidegate/deploy => ../../../deploy
	github.com/slidegate/slidegate/grpclimit => ../../../grpclimit
	github.com/slidegate/slidegate/internal/rls => ../../../internal/rls
	github.com/slidegate/slidegate/internal/server => ../../../internal/server
	github.com/slidegate/slidegate/lab => ../..
	github.com/slidegate/slidegate/redisstore => ../../../redisstore
	github.com/slidegate/slidegate/remote => ../../../remote
)

require (
	github.com/go-redis/redis_rate/v10 v10.0.1
	github.com/prometheus/client_golang v1.25.0
	github.com/redis/go-redis/v9 v9.23.0
	github.com/slidegate/slidegate v0.0.0-00010101000000-000000000000
	github.com/slidegate/slidegate/lab v0.0.0-00010101000000-000000000000
	github.com/slidegate/slidegate/redisstore v0.0.0-00010101000000-000000000000
	github.com/throttled/throttled/v2 v2.15.0
	github.com/ulule/limiter/v3 v3.11.2
)

require (
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/prometheus/client_model v0.6.3 // indirect
	github.com/prometheus/common v0.72.0 // indirect
	github.com/prometheus/procfs v0.22.0 // indirect
	github.com/puzpuzpuz/xsync/v3 v3.5.1 // indirect
	github.com/redis/rueidis v1.0.79 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)
