() => {
  // The Step grid scrolls sideways on a narrow screen: each grid says on which sides more positions lie
  // (data-more-left, data-more-right: assets/style.css fades that edge and says so in the heading).
  const mark = (wrap) => {
    const left = wrap.scrollLeft > 1, right = wrap.scrollLeft + wrap.clientWidth < wrap.scrollWidth - 1;
    wrap.toggleAttribute("data-more-left", left);
    wrap.toggleAttribute("data-more-right", right);
  };
  const markAll = () => document.querySelectorAll(".token-grid-wrap").forEach(mark);
  document.addEventListener("scroll", (event) => {
    if (event.target instanceof Element && event.target.matches(".token-grid-wrap")) mark(event.target);
  }, true);
  window.addEventListener("resize", markAll);
  new MutationObserver(markAll).observe(document.body, {childList: true, subtree: true});
  // On a narrow screen (a phone) the page starts with the settings sidebar closed: open, it covers the whole page.
  // The sidebar appears once Gradio has drawn the page; look for it a few times.
  markAll();
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
