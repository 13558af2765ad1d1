// Package bustest is the contract every bus.Bus implementation must meet, as one test suite:
// Run it from a test of the implementation with a constructor for fresh buses. The in-process
// bus and the Redis bus both run it (sdk/bus), and so can any later transport.
//
// A bus that implements Clock gets its TTLs checked exactly on a fake clock; any other bus is
// given short real TTLs that the suite only waits out, so a slow machine cannot fail it.
package bustest
