package httplimit

// RemotePause is remotePause, for the table test of the headers it reads.
var RemotePause = remotePause
