() => {
  // On a narrow screen (a phone) the page starts with the settings sidebar closed: open, it covers the whole page.
  // The sidebar appears once Gradio has drawn the page; look for it a few times.
  if (!window.matchMedia("(max-width: 768px)").matches) return;
  const close = (tries) => {
    const sidebar = document.querySelector("#settings-sidebar");
    if (sidebar === null) {
      if (tries > 0) setTimeout(() => close(tries - 1), 100);
      return;
    }
    if (sidebar.classList.contains("open")) sidebar.querySelector(".toggle-button")?.click();
  };
  close(100);
}
