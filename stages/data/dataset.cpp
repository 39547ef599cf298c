// placeholder: filled in by the data-path work (issue 3)
