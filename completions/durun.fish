complete --keep-order --exclusive --command durun --arguments "(COMPLETE=fish durun -- (commandline --current-process --tokenize --cut-at-cursor) (commandline --current-token))"
