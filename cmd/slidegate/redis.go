package main

import (
	"github.com/slidegate/slidegate/internal/redisnames"
	"github.com/slidegate/slidegate/internal/server"
	"github.com/slidegate/slidegate/internal/server/redisfactory"
)

// The Redis backend: slidegate serve --store redis://host:port/db,
// rediss://, unix://, redis-cluster://host:port,host:port,
// rediss-cluster://, redis-sentinel://host:port?master_set=NAME or
// rediss-sentinel://, and each as valkey://… too (redisnames.Schemes),
// with store_options in the YAML configuration (redisstore.OptionsFromMap).
func init() {
	for _, scheme := range redisnames.Schemes {
		storeOptions = append(storeOptions, server.WithStore(scheme, openRedis))
	}
}

// openRedis is the server.StoreFactory for Redis (redisfactory.New).
var openRedis = redisfactory.New()
