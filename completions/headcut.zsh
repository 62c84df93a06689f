#compdef headcut

_headcut_completion() {
  eval $(env _TYPER_COMPLETE_ARGS="${words[1,$CURRENT]}" _HEADCUT_COMPLETE=complete_zsh headcut)
}

compdef _headcut_completion headcut
