package main

import "github.com/spf13/cobra"

// addCommands registers the subcommands. One line per command; NewRootCmd adds the
// environment-variable plumbing and help text to whatever is registered here.
func addCommands(root *cobra.Command) {
	root.AddCommand(
		newVersionCmd(),
		newModelCmd(),
		newGenerateCmd(),
		newBenchCmd(),
		newServeCmd(),
		newWeightsCmd(),
		newFleetCmd(),
		newAdminCmd(),
	)
}
