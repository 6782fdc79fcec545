module github.com/slidegate/slidegate/compat/envoy

go 1.26.0

replace (
	github.com/slidegate/slidegate => ../..
	github.com/slidegate/slidegate/cmd/slidegate => ../../cmd/slidegate
	github.com/slidegate/slidegate/deploy => ../../deploy
	github.com/slidegate/slidegate/grpclimit => ../../grpclimit
	github.com/slidegate/slidegate/internal/rls => ../../internal/rls
	github.com/slidegate/slidegate/internal/server => ../../internal/server
	github.com/slidegate/slidegate/lab => ../../lab
	github.com/slidegate/slidegate/redisstore => ../../redisstore
	github.com/slidegate/slidegate/remote => ../../remote
	github.com/slidegate/slidegate/telemetry => ../../telemetry
)

require (
	github.com/envoyproxy/go-control-plane/envoy v1.40.0
	github.com/redis/go-redis/v9 v9.23.0
	github.com/slidegate/slidegate v0.0.0-00010101000000-000000000000
	github.com/slidegate/slidegate/internal/rls v0.0.0-00010101000000-000000000000
	github.com/slidegate/slidegate/redisstore v0.0.0-00010101000000-000000000000
	github.com/slidegate/slidegate/telemetry v0.0.0-00010101000000-000000000000
	go.opentelemetry.io/proto/otlp v1.11.0
	google.golang.org/grpc v1.85.0
	google.golang.org/protobuf v1.36.12
)

require (
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/cncf/xds/go v0.0.0-20260202195803-dba9d589def2 // indirect
	github.com/envoyproxy/protoc-gen-validate v1.3.3 // indirect
	github.com/grpc-ecosystem/grpc-gateway/v2 v2.30.0 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/planetscale/vtprotobuf v0.6.1-0.20240319094008-0393e58bdf10 // indirect
	github.com/prometheus/client_golang v1.25.0 // indirect
	github.com/prometheus/client_model v0.6.3 // indirect
	github.com/prometheus/common v0.72.0 // indirect
	github.com/prometheus/procfs v0.22.0 // indirect
	github.com/puzpuzpuz/xsync/v3 v3.5.1 // indirect
	github.com/redis/rueidis v1.0.79 // indirect
	github.com/slidegate/slidegate/internal/server v0.0.0-00010101000000-000000000000 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	go.yaml.in/yaml/v3 v3.0.6 // indirect
	golang.org/x/net v0.62.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
	golang.org/x/text v0.44.0 // indirect
	google.golang.org/genproto/googleapis/api v0.0.0-20260928230214-8a89bd6388cc // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20261123191846-1e707ab9fbc2 // indirect
)
