// Package redisstate keeps a relay.State on Redis.
package redisstate
