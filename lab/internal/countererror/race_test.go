//go:build race

package countererror

const raceEnabled = true
